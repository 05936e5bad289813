"""Standard benchmarks: a run's base model and its fine-tune scored on lm-evaluation-harness tasks (GSM8K, MMLU,
HellaSwag, ARC, IFEval, or tasks of your own in lm-eval's YAML format), through Hone's own model loading.

    tasks   require_lm_eval, select_tasks -> TaskSelection: names checked (close ones offered), data read
    run     score_tasks(run_dir, config, models, selection, limit=, num_fewshot=, chat_template=, system_instruction=)
            -> TaskTable
    prompts check_task_prompts: --chat-template's needs (the run's tokenizer has a template) met before any weights load
    model   HoneLM: lm-eval's HFLM over the model Hone loaded (imports lm-eval and torch; not re-exported)
    store   RUN_DIR/lm_eval_scores.json: read_task_scores, store_task_scores, TaskScore (stdlib only)

lm-eval is the optional `eval` extra (`pip install "hone-studio[eval]"`); this package imports it only when it runs.
"""

from hone.core.inference.harness.prompts import check_task_prompts
from hone.core.inference.harness.run import TASK_BATCH_SIZE, TaskTable, score_tasks
from hone.core.inference.harness.store import (
    LM_EVAL_SCORES_FILE,
    StoredTaskScores,
    TaskScore,
    read_task_scores,
    store_task_scores,
)
from hone.core.inference.harness.tasks import (
    LM_EVAL_INSTALL,
    SelectedTask,
    TaskSelection,
    require_lm_eval,
    select_tasks,
    split_specs,
)

__all__ = [
    "LM_EVAL_INSTALL",
    "LM_EVAL_SCORES_FILE",
    "TASK_BATCH_SIZE",
    "SelectedTask",
    "StoredTaskScores",
    "TaskScore",
    "TaskSelection",
    "TaskTable",
    "check_task_prompts",
    "read_task_scores",
    "require_lm_eval",
    "score_tasks",
    "select_tasks",
    "split_specs",
    "store_task_scores",
]
