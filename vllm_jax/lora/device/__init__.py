"""LoRA's device side: the stacked adapter slots the forward reads, and the program that writes one."""
