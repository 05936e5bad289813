"""Scores of a run's checkpoints on held-out rows: computed (`select_checkpoints`, `score_checkpoints`), stored in
RUN_DIR/scores.json and read back without a model (`read_scores`, `best_stored`, `stored_for_step`).

    score          select_checkpoints(run_dir, "all" | "best" | "20,40") -> checkpoints, notes;
                   score_checkpoints(run_dir, config, checkpoints, data_file, rows) -> ScoreTable (stored entries
                   of the same weights and data are reused, new ones stored)
    read           read_scores(run_dir) -> StoredScores (entries, damage); checkpoint_weights(run_dir);
                   current_entries (entries of checkpoints still there), latest_data
    pick           best_stored(run_dir, by="loss") -> ScoreEntry; best_entry(entries, by); stored_for_step;
                   weights_choices(run_dir) -> ([WeightsChoice], note): what the Export page offers
    after a run    score_trained_checkpoints(trainer) (train.eval_checkpoints: with the model the run trained)
                   METRICS (name -> (what, lower is better)), DEFAULT_METRIC, check_metric, DEFAULT_ROWS
    lm-eval tasks  require_lm_eval, split_specs, select_tasks(specs, task_dir) -> TaskSelection;
                   score_tasks(run_dir, config, models, selection, limit=, num_fewshot=, chat_template=,
                   system_instruction=) -> TaskTable (the base and the fine-tune on lm-evaluation-harness tasks,
                   stored in RUN_DIR/lm_eval_scores.json); check_task_prompts (the run's chat template, before loading);
                   read_task_scores -> StoredTaskScores, TaskScore, LM_EVAL_SCORES_FILE, LM_EVAL_INSTALL

Light to import: torch loads when `score_checkpoints` loads a model, lm-eval when `select_tasks` runs, never at import
(the Studio reads scores).
"""

from __future__ import annotations

from hone.core.inference.checkpoint_scoring import (
    DEFAULT_ROWS,
    SavedCheckpoint,
    ScoreTable,
    saved_checkpoints,
    score_after_training,
    score_checkpoints,
    select_checkpoints,
)
from hone.core.inference.export_choices import WeightsChoice, weights_choices
from hone.core.inference.harness import (
    LM_EVAL_INSTALL,
    LM_EVAL_SCORES_FILE,
    TASK_BATCH_SIZE,
    StoredTaskScores,
    TaskScore,
    TaskSelection,
    TaskTable,
    check_task_prompts,
    read_task_scores,
    require_lm_eval,
    score_tasks,
    select_tasks,
    split_specs,
)
from hone.core.inference.score_store import (
    DEFAULT_METRIC,
    METRICS,
    SCORES_FILE,
    DataKey,
    ScoreEntry,
    StoredScores,
    best_entry,
    best_stored,
    check_metric,
    checkpoint_weights,
    current_entries,
    latest_data,
    read_scores,
    stored_for_step,
)

__all__ = [
    "DEFAULT_METRIC",
    "DEFAULT_ROWS",
    "LM_EVAL_INSTALL",
    "LM_EVAL_SCORES_FILE",
    "METRICS",
    "SCORES_FILE",
    "TASK_BATCH_SIZE",
    "DataKey",
    "SavedCheckpoint",
    "ScoreEntry",
    "ScoreTable",
    "StoredScores",
    "StoredTaskScores",
    "TaskScore",
    "TaskSelection",
    "TaskTable",
    "WeightsChoice",
    "best_entry",
    "best_stored",
    "check_metric",
    "check_task_prompts",
    "checkpoint_weights",
    "current_entries",
    "latest_data",
    "read_scores",
    "read_task_scores",
    "require_lm_eval",
    "saved_checkpoints",
    "score_checkpoints",
    "score_tasks",
    "score_trained_checkpoints",
    "select_checkpoints",
    "select_tasks",
    "split_specs",
    "stored_for_step",
    "weights_choices",
]


def score_trained_checkpoints(trainer, progress=None) -> ScoreTable:
    """train.eval_checkpoints, once a run has ended: its checkpoints and the base scored as `hone eval RUN
    --checkpoints all` does, with the model the `trainer` trained (its optimizer state let go first), into
    RUN_DIR/scores.json.

    Raises:
        HoneError: as `score_checkpoints` (no evaluation file, no row with a reference, a damaged checkpoint).
    """
    import gc

    import torch

    trainer.step_loop = None  # the optimizer's state and the step's buffers: scoring needs none of them
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return score_after_training(
        trainer.writer.run_dir, trainer.config, trainer.model, trainer.tokenizer, trainer.device, progress
    )
