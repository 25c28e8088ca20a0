"""Multimodal's device side: the vision encoder's programs and the image rows of a vision-language step."""
