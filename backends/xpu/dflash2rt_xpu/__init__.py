"""dflash2rt-xpu: the Intel XPU backend plugin for dflash2rt."""
