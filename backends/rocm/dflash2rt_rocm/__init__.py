"""dflash2rt-rocm: the AMD ROCm backend plugin for dflash2rt."""
