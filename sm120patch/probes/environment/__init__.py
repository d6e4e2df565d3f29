"""What the probes look at: the GPUs, the FlashInfer that will run, ELF images, compiled caches, the overlay."""
