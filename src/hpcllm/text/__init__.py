"""Text data: sources, shards, tokenization and Megatron's indexed dataset."""
