"""Using a model after training: streaming chat with the base and the fine-tune side by side (`chat`), held-out
prompts scored on both (`evaluate`), and the prompt files both read (`prompts`, stdlib only); a preference run's
held-out pairs ranked (`preference_eval`); every saved checkpoint scored beside the base (`checkpoint_scoring`), by
the answer scores of `answer_scores` (stdlib only), into the run folder's scores.json (`score_store`, stdlib only);
the base and the fine-tune on lm-evaluation-harness tasks, into lm_eval_scores.json (`harness`, the eval extra).
Light to import; torch loads when a model does, lm-eval when its tasks run."""
