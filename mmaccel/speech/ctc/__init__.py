"""CTC decoding: greedy and batched beam search with n-gram LM fusion and phrase boosting."""
