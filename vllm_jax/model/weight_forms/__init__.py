"""The stored forms of a linear weight, one class a module behind one interface (`base.WeightForm`): each does its
own matmul, so the layer code (model/layers.py: `linear`, `linears`) calls it without asking which form it holds
(docs/architecture/06-model.md, "Weight forms"). `bundle` picks the form of each of a layer's stored linears and
expert stacks. The MoE expert stacks (`experts.ExpertStack`, `expert_lora`) and the embedding table
(`embedding_tables.EmbeddingTable`) are forms too, behind their own small interfaces."""
