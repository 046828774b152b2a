"""The recipe that trains the bundled pair: stdlib corpus, BPE, target, DFlash2 draft distillation."""
