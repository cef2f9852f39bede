"""Command-line entry points for training: corpus, tokenizer, prompts, target, drafters, policy."""
