"""The one door into the engine: what the Studio (hone.app) and the `hone` command line (hone.core.cli) call.

Besides this door they import only core's base modules: config, control (RunControl pauses and stops a run),
errors, events, model_info, resources, version (tests/test_layering.py checks it). A page or a command that needs
something new from the engine adds it here, in the submodule of its verb.

    start a run    Trainer(config, control, world=).run() -> events, in this process (torch loads with it);
                   process_world (torchrun's processes); check_inputs, check_model, check_data_files (before
                   anything loads); sharding_refusal (why a model cannot be split over GPUs)
    resume a run   Trainer(config, control, resume_dir=RUN_DIR, data_changed=); check_resume, DATA_CHANGED
    follow a run   read_events, EventTail, in_use, read_holder, live_summary, step_line, speed_choice, PEER_ADVICE;
                   read_samples -> [SampleStep] (RUN_DIR/samples.jsonl: train.sample_prompts' answers per evaluation);
                   can_pause, request_pause, can_stop, request_stop (a run another process trains);
                   MetricsReader -> StepColumns (a run's chart columns, fast), downsample (what a chart draws)
    list runs      list_runs -> [RunSummary]; a run folder's names CONFIG_FILE, METRICS_FILE, LOG_FILE,
                   ADAPTER_DIR, INTERRUPTED, DAMAGED
    check data     check_data, check_pairs (preference pairs), check_unpaired (KTO rows), check_preference (either,
                   with its tokenized rows), check_prompts (GRPO prompts), format_report, inspect_row, inspect_rows,
                   inspect_preference_rows (a pair's answers side by side), format_view;
                   the readers under them:
                   resolve_sources, read_records, SourceError, RowError, DUPLICATES_KEY, detect_format,
                   suggest_columns, ColumnNames, apply_template_setting
    read a model   inspect_model, tokenizer_for, resolve_source, pending_conversion, gguf_folder,
                   gguf_conversion_folder, family_of; measure_model_backends (MoE experts backends, timed)
    plan memory    plan_run, detect_memory, Memory, parse_size, GIB, estimate_host
    a CPU run      detect_system_memory, measure_matmul_rate, epoch_tokens, estimate_run_time -> TimeEstimate
    export         export_run (checkpoint=STEP: a saved checkpoint's adapter), checkpoint_output, parse_format,
                   SUPPORTED_FORMATS, FORMAT_TYPES, MANIFEST_FILE, open_run, output_folder
    chat, evaluate ChatModels, GenerationSettings, BASE, TUNED; read_prompts, with_references, compare,
                   held_out_file; preference runs: held_out_pairs, score_pairs -> PreferenceScores
    compare runs   read_run -> RunNumbers (settings, metrics, problems, RunSeries: chart columns), compare_runs ->
                   RunComparison, differing_settings, comparison (JSON), metric_text, setting_text, METRIC_COLUMNS
    score          select_checkpoints, score_checkpoints -> ScoreTable; score_trained_checkpoints (at a run's end);
                   read_scores, best_stored, stored_for_step, weights_choices (what Export offers),
                   best_entry, METRICS, DEFAULT_METRIC, check_metric (a run's checkpoints on held-out rows, stored in
                   RUN_DIR/scores.json; reading needs no torch); lm-eval tasks: require_lm_eval, split_specs,
                   select_tasks -> TaskSelection, check_task_prompts, score_tasks -> TaskTable, read_task_scores
                   (lm_eval_scores.json)
    the Hub        search_models, model_files, download_model, save_token, forget_token, push_folder, hub_user,
                   fits_this_machine
    this machine   MachineFacts, read_machine; Telemetry, TelemetrySample, GpuListing, list_gpus; check_runtime;
                   prefer_expandable_segments, guard_bitsandbytes_import (a process's first steps)
    demos          demo_config, run_demo, vision_demo_config, run_vision_demo, CHANCE

Two corners live in submodules of their own, not re-exported here:

    hone.core.api.child_run  train_in_child: the Studio's run in a child process. The child is
                             `python -m hone.core.cli`, and the CLI imports this package, so re-exporting it here
                             would close an import circle.
    hone.core.api.bench      `hone bench`'s internals (scenarios, variants, runners, reports), the CLI's alone.

Importing this package loads nothing: a name loads its submodule when first used, and a name whose engine module
needs torch loads it only then, so a Studio page may import any name at module level.
"""

from __future__ import annotations

import importlib

_LAZY = {
    **dict.fromkeys(
        (
            "ADAPTER_DIR",
            "CONFIG_FILE",
            "DAMAGED",
            "DATA_CHANGED",
            "INTERRUPTED",
            "LOG_FILE",
            "METRICS_FILE",
            "MetricsReader",
            "MethodColumnsReader",
            "METHOD_FIELDS",
            "StepBlock",
            "PEER_ADVICE",
            "EventTail",
            "StepColumns",
            "RunSummary",
            "Trainer",
            "check_data_files",
            "check_inputs",
            "check_model",
            "can_pause",
            "can_stop",
            "check_resume",
            "in_use",
            "list_runs",
            "live_summary",
            "process_world",
            "read_events",
            "read_holder",
            "read_samples",
            "SAMPLES_FILE",
            "SampleStep",
            "request_pause",
            "request_stop",
            "sharding_refusal",
            "speed_choice",
            "step_line",
            "downsample",
        ),
        "hone.core.api.runs",
    ),
    **dict.fromkeys(
        (
            "DUPLICATES_KEY",
            "ColumnNames",
            "RowError",
            "SourceError",
            "apply_template_setting",
            "check_data",
            "check_pairs",
            "check_preference",
            "check_prompts",
            "check_unpaired",
            "detect_format",
            "format_report",
            "format_preference_view",
            "format_prompt_view",
            "format_view",
            "inspect_preference_rows",
            "inspect_prompt_rows",
            "inspect_row",
            "inspect_rows",
            "read_records",
            "resolve_sources",
            "suggest_columns",
        ),
        "hone.core.api.data",
    ),
    **dict.fromkeys(
        (
            "family_of",
            "gguf_conversion_folder",
            "gguf_folder",
            "inspect_model",
            "pending_conversion",
            "resolve_source",
            "tokenizer_for",
        ),
        "hone.core.api.models",
    ),
    "measure_model_backends": "hone.core.api.bench",
    **dict.fromkeys(
        ("TimeEstimate", "detect_system_memory", "epoch_tokens", "estimate_run_time", "measure_matmul_rate"),
        "hone.core.api.cpu_run",
    ),
    **dict.fromkeys(
        ("GIB", "Memory", "detect_memory", "estimate_host", "parse_size", "plan_run"), "hone.core.api.memory"
    ),
    **dict.fromkeys(
        (
            "DEFAULT_TYPES",
            "FORMAT_TYPES",
            "MANIFEST_FILE",
            "SUPPORTED_FORMATS",
            "checkpoint_output",
            "export_run",
            "open_run",
            "output_folder",
            "parse_format",
        ),
        "hone.core.api.export",
    ),
    **dict.fromkeys(
        (
            "BASE",
            "CHAT_REPETITION_PENALTY",
            "TUNED",
            "ChatModels",
            "GenerationSettings",
            "PreferenceScores",
            "compare",
            "held_out_file",
            "held_out_pairs",
            "read_prompts",
            "score_pairs",
            "with_references",
        ),
        "hone.core.api.chat",
    ),
    **dict.fromkeys(
        (
            "METRIC_COLUMNS",
            "NOT_A_RUN",
            "NOT_SETTINGS",
            "RunComparison",
            "RunNumbers",
            "RunSeries",
            "compare_runs",
            "comparison",
            "differing_settings",
            "metric_text",
            "metrics_of",
            "read_run",
            "setting_text",
            "unique_names",
        ),
        "hone.core.api.run_comparison",
    ),
    **dict.fromkeys(
        (
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
        ),
        "hone.core.api.scores",
    ),
    **dict.fromkeys(
        (
            "download_model",
            "fits_this_machine",
            "forget_token",
            "hub_user",
            "model_files",
            "push_folder",
            "save_token",
            "search_models",
        ),
        "hone.core.api.hub",
    ),
    **dict.fromkeys(
        (
            "GpuListing",
            "MachineFacts",
            "Telemetry",
            "TelemetrySample",
            "check_runtime",
            "guard_bitsandbytes_import",
            "list_gpus",
            "prefer_expandable_segments",
            "read_machine",
        ),
        "hone.core.api.machine",
    ),
    **dict.fromkeys(
        ("CHANCE", "demo_config", "run_demo", "run_vision_demo", "vision_demo_config"), "hone.core.api.demo"
    ),
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
