"""Using a model after training: streaming chat with the base and the fine-tune side by side (`chat`), held-out
prompts scored on both (`evaluate`), and the prompt files both read (`prompts`, stdlib only). Light to import;
torch loads when a model does."""
