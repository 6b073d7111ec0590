"""What decoding runs on: the CPU's features (``cpu_features``), thread
counts and torch's threads (``threads``), int8 inference (``quantization``)
and the Transformer layer arithmetic shared by the torch verifier and the
block drafter (``layer_ops``)."""
