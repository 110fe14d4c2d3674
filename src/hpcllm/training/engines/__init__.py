"""The two engines (the torch engine and Megatron-LM), their command lines, their log
lines and the dataset index cache they load."""
