"""dflash2rt-cuda: the NVIDIA CUDA backend plugin for dflash2rt."""
