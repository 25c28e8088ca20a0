"""Checkpoint -> sharded params at start-up: model source resolution (`source`), one `WeightLoader` per format
(`weight_loader`), HF-name weight maps (`weight_maps`), GGUF reading (`gguf_file`) and tokenizer loading."""
