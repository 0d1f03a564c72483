"""Conversations rendered to token ids: the o200k tokenizer and the default chat format."""
