"""Train page: presets, the settings form generated from RunConfig (Basic or Advanced, remembered), and Start."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QButtonGroup, QCheckBox, QFileDialog, QHBoxLayout, QPushButton, QWidget

from hone.app.cpu_estimate import plan_on_cpu
from hone.app.helper_process import in_helper
from hone.app.jobs import plan_memory
from hone.app.pages.base import Page
from hone.app.presets import PRESETS, PRESETS_BY_NAME, matching_preset, presets_for
from hone.app.run_checks import data_problems, machine_problems
from hone.app.theme import Palette, icon
from hone.app.widgets.common import Card, label, set_role
from hone.app.widgets.config_form import SECTION_TITLES, ConfigForm, field_label
from hone.app.widgets.form_choice import FormChoice, hidden_changes
from hone.app.widgets.memory_estimate import MemoryEstimateView
from hone.app.workers import Task
from hone.core.api import sharding_refusal
from hone.core.config import RunConfig
from hone.core.errors import ConfigError
from hone.core.events import RunStarted

MOE_KEY = "speed.moe_backend"
ESTIMATE_DELAY_MS = 400  # edits in a row (typing a number) start one estimate, not one per keystroke


def measure_backends(model_cfg, progress=None):
    """Hone's MoE experts backends timed on the model's own shapes, on the GPU (on a worker thread)."""
    from hone.core.api import measure_model_backends

    return measure_model_backends(model_cfg, "cuda", progress=progress)


def detect_memory():
    from hone.core.api import detect_memory as detect

    return detect()


class TrainPage(Page):
    name = "train"
    title = "Train"
    subtitle = "Choose how to train. Hover a setting to see what it does; problems show up before you start."
    icon_name = "train"

    started = Signal(object)  # RunConfig

    def __init__(self, state, parent: QWidget | None = None):
        super().__init__(state, parent)
        self.load_button = QPushButton("Open config…")
        self.load_button.clicked.connect(self._open_config)
        self.save_button = QPushButton("Save config…")
        self.save_button.clicked.connect(self._save_config)
        self.start_button = set_role(QPushButton("Start training"), "primary")
        self.start_button.clicked.connect(self.start)
        for button in (self.load_button, self.save_button, self.start_button):
            self.header.actions.addWidget(button)

        presets = Card("Presets", "A starting point; every setting below stays editable.")
        row = QHBoxLayout()
        row.setSpacing(8)
        self.preset_group = QButtonGroup(self)
        self.preset_group.setExclusive(False)  # none is checked once the user edits a setting
        self.preset_buttons: dict[str, QPushButton] = {}
        for preset in PRESETS:
            button = set_role(QPushButton(preset.name), "preset")
            button.setCheckable(True)
            button.setToolTip(
                f"{preset.description}\nFor runs that learn from preferences or rewards (DPO, SimPO, ORPO, KTO, "
                "GRPO) it also sets a learning rate of 5e-6 and, for preferences, β = 0.1."
            )
            button.clicked.connect(lambda _=False, name=preset.name: self.apply_preset(name))
            self.preset_group.addButton(button)
            self.preset_buttons[preset.name] = button
            row.addWidget(button)
        row.addStretch(1)
        presets.body.addLayout(row)
        self.preset_note = label("", "muted", wrap=True)
        presets.body.addWidget(self.preset_note)
        self.body.addWidget(presets)

        self.summary = Card("This run")
        self.summary_text = label("", wrap=True, selectable=True)
        self.problems = label("", "error", wrap=True)
        self.summary.body.addWidget(self.summary_text)
        self.memory = MemoryEstimateView()
        self.memory.fix_requested.connect(lambda assignments: self.state.update(*assignments))
        self.summary.body.addWidget(self.memory)
        self.summary.body.addWidget(self.problems)
        self.background_box = QCheckBox("Keep training when Hone Studio closes")
        self.background_box.setToolTip(
            "Closing the window leaves the run training in its own process, and Runs "
            "follows it again when you reopen Hone Studio. Left off, closing the window "
            "asks to stop the run (it saves first)."
        )
        self.summary.body.addWidget(self.background_box)
        self.body.addWidget(self.summary)
        # What memory the estimate is held against: the first GPU's free memory, or without a GPU the RAM available
        # (tests give their own).
        self.memory_source = detect_memory
        # Without a GPU, the CPU's float32 matmul rate the time estimate divides by; None: the helper process measures
        # it once (tests give their own).
        self.cpu_rate: float | None = None
        self.estimate_task: Task | None = None
        self._estimate_timer = QTimer(self)
        self._estimate_timer.setSingleShot(True)
        self._estimate_timer.setInterval(ESTIMATE_DELAY_MS)
        self._estimate_timer.timeout.connect(self._estimate)

        self.moe_card = Card(
            "Mixture-of-experts backends",
            "Time grouped_mm, Triton and PyTorch on this model's own "
            "expert shapes (two random-init layers of its configuration) on this GPU, then keep "
            "the fastest.",
        )
        moe_row = QHBoxLayout()
        self.measure_button = QPushButton("Measure on this GPU")
        self.measure_button.clicked.connect(self.measure_moe_backends)
        self.use_fastest_button = QPushButton("Use the fastest")
        self.use_fastest_button.clicked.connect(self._use_fastest)
        self.use_fastest_button.hide()
        moe_row.addWidget(self.measure_button)
        moe_row.addWidget(self.use_fastest_button)
        moe_row.addStretch(1)
        self.moe_card.body.addLayout(moe_row)
        self.moe_results = label("", wrap=True, selectable=True)
        self.moe_card.body.addWidget(self.moe_results)
        self.moe_card.hide()
        self.moe_task: Task | None = None
        self.fastest_backend = ""
        self.body.addWidget(self.moe_card)

        self.gpu_card = Card(
            "GPUs",
            "Tick the GPUs this run trains on. Several train it together: one process per "
            "GPU, each step's rows shared out among them, the same tokens per step as on one.",
        )
        self.gpu_row = QHBoxLayout()
        self.gpu_row.setSpacing(16)
        self.gpu_card.body.addLayout(self.gpu_row)
        self.gpu_boxes: list[QCheckBox] = []
        self.gpu_card.hide()
        self.body.addWidget(self.gpu_card)

        self.form = ConfigForm()
        self.form.changed.connect(self._form_changed)
        self.form_choice = FormChoice()
        self.form_choice.chosen.connect(self.show_form)
        self.basic_button, self.advanced_button = self.form_choice.basic_button, self.form_choice.advanced_button
        self.hidden_note = self.form_choice.note
        self.body.addWidget(self.form_choice)
        self.body.addWidget(self.form)
        self.body.addStretch(1)

        self._auto_pick = ""
        state.config_changed.connect(self._config_changed)
        state.model_info_changed.connect(lambda _info: self._refresh())
        state.session.running_changed.connect(lambda _running: self._refresh())
        state.machine_changed.connect(self._list_gpus)
        state.data_readiness.changed.connect(self._refresh)
        state.session.event.connect(self._event)
        self.form.set_config(state.config)
        self.form.set_basic(state.settings.train_form() == "basic")
        self.form_choice.set_form(state.settings.train_form())
        self._refresh()

    def show_form(self, form: str) -> None:
        """Show the Basic or the Advanced form ("basic" / "advanced"), and remember it for the next start."""
        self.form.set_basic(form == "basic")
        self.form_choice.set_form(form)
        self.state.settings.set_train_form(form)
        self._refresh()

    # ---- actions ----
    def apply_preset(self, name: str) -> None:
        """Apply a preset on top of the current config (model, data and output stay)."""
        try:
            base = self.form.config()
        except ConfigError:
            base = self.state.config
        self.state.set_config(PRESETS_BY_NAME[name].apply(base))

    def start(self) -> None:
        """Validate, then start the run on its worker thread and switch to the Monitor."""
        problems = self.problem_list()
        if problems or self.state.session.is_running:
            self._refresh()
            return
        config = self.form.config()
        self.state.set_config(config)
        self.state.session.start(config, gpus=self.selected_gpus() or None, background=self.background_box.isChecked())
        self.started.emit(config)
        self.state.page_requested.emit("monitor")

    def data_check_pending(self) -> bool:
        """The training data's rows are being read to know whether any is usable (Start stays possible meanwhile:
        the run's own check gives the same answer)."""
        config = self.state.config
        return self.state.data_readiness.pending(config.data, config.train.method)

    def problem_list(self) -> list[str]:
        """Every reason Start is not possible yet, in words: the form's checks, then what the trainer would refuse
        on this machine (GPU-only choices without a GPU, missing data, settings that contradict each other)."""
        errors = self.form.errors()
        problems = list(errors.values())
        if not self.state.config.model.name_or_path:
            problems.append("Choose a model on the Model page.")
        if not self.state.config.data.train:
            problems.append("Choose training data on the Data page.")
        if not errors:
            config = self.form.config()
            problems += machine_problems(config, self.state.machine)
            missing = data_problems(config)
            # rows are read only from data that is there; the reading runs in the background (data_readiness)
            problems += missing or self.state.data_readiness.problems(config.data, config.train.method)
        if self.gpu_boxes and not self.selected_gpus():
            problems.append("Tick at least one GPU to train on.")
        if len(self.selected_gpus()) > 1 and not errors and self.form.config().train.parallel == "fsdp":
            why, _setting = sharding_refusal(
                self.form.config(), is_vision=bool((self.state.model_info or {}).get("is_vision"))
            )
            if why:  # what the trainer would refuse at the start of the run
                problems.append(f"Split the model across GPUs: {why}. Choose another \u201cSeveral GPUs\u201d setting.")
        return problems

    # ---- GPUs ----
    def _list_gpus(self, machine) -> None:
        """One box per NVIDIA GPU when the machine has several; the first is ticked."""
        for box in self.gpu_boxes:
            box.deleteLater()
        self.gpu_boxes = []
        gpus = list(getattr(machine, "gpus", ()) or ())
        for gpu in gpus if len(gpus) > 1 else []:
            memory = f" · {gpu.memory_total / 2**30:.0f} GiB" if gpu.memory_total else ""
            box = QCheckBox(f"GPU {gpu.index} · {gpu.name}{memory}")
            box.setChecked(gpu.index == gpus[0].index)
            box.setProperty("gpu_index", gpu.index)
            box.toggled.connect(lambda _checked: self._refresh())
            self.gpu_row.addWidget(box)
            self.gpu_boxes.append(box)
        self._refresh()

    def selected_gpus(self) -> list[int]:
        """The ticked GPUs' indices; empty when the machine has at most one GPU (the run takes it)."""
        return [box.property("gpu_index") for box in self.gpu_boxes if box.isChecked()]

    # ---- syncing with the state ----
    def _form_changed(self) -> None:
        if self.form.is_valid():
            self.state.set_config(self.form.config())
        self._refresh()

    def _config_changed(self, config: RunConfig) -> None:
        # edits from the form itself are already shown; refill only for changes made elsewhere
        if self.form.values() != config.to_dict():
            self.form.set_config(config)
        self._refresh()

    def _event(self, event) -> None:
        if isinstance(event, RunStarted) and "moe" in event.speed_paths:
            self._auto_pick = event.speed_paths["moe"]
            self._refresh()

    def is_busy(self) -> bool:
        """A memory estimate is waiting to start (edits settle first) or running."""
        return self._estimate_timer.isActive() or bool(self.estimate_task and self.estimate_task.is_running())

    # ---- MoE backends measured ----
    def measure_moe_backends(self) -> None:
        """Time each experts backend on the chosen model's shapes, on a worker thread; the table shows here."""
        if self.moe_task is not None and self.moe_task.is_running():
            return
        self.measure_button.setEnabled(False)
        self.use_fastest_button.hide()
        self.moe_results.setText("Measuring… (builds two random-init layers per backend; a minute or two)")
        self.moe_task = Task(
            measure_backends,
            self.state.config.model,
            on_result=self._show_backends,
            on_error=self._backends_failed,
            on_progress=lambda backend: self.moe_results.setText(f"Measuring {backend}…"),
        )

    def _show_backends(self, results: list) -> None:
        self.measure_button.setEnabled(True)
        timed = [r for r in results if not isinstance(r, str)]
        lines = [
            f"{r.backend}: {r.tokens_per_s:,.0f} tokens/s"
            + (f", {r.peak_bytes / 2**30:.1f} GiB peak" if r.peak_bytes else "")
            for r in timed
        ]
        lines += [f"{r} (not measured)" for r in results if isinstance(r, str)]
        if timed:
            best = max(timed, key=lambda r: r.tokens_per_s)
            self.fastest_backend = best.backend
            lines.append(f"Fastest here: {best.backend}.")
            self.use_fastest_button.setText(f"Use {best.backend}")
            self.use_fastest_button.show()
        self.moe_results.setText("\n".join(lines))

    def _backends_failed(self, error) -> None:
        self.measure_button.setEnabled(True)
        self.moe_results.setText(f"Could not measure: {error.message}" + (f" {error.advice}" if error.advice else ""))

    def _use_fastest(self) -> None:
        if self.fastest_backend:
            self.state.update(f'{MOE_KEY}="{self.fastest_backend}"')

    def _refresh(self) -> None:
        config = self.state.config
        is_moe = self.state.is_moe
        machine = self.state.machine
        advanced = not self.form.is_basic()
        self.moe_card.setVisible(bool(is_moe) and advanced)
        # Which GPUs train stays in Basic: not a setting of the run but the hardware under it, on machines with several.
        self.gpu_card.setVisible(bool(self.gpu_boxes))
        offered = presets_for(has_gpu=machine is None or machine.has_gpu)  # unknown yet: no CPU preset
        for name, button in self.preset_buttons.items():
            button.setVisible(PRESETS_BY_NAME[name] in offered)
        running = self.state.session.is_running
        measuring = self.moe_task is not None and self.moe_task.is_running()
        self.measure_button.setEnabled(bool(machine and machine.has_gpu) and not running and not measuring)
        self.measure_button.setToolTip(
            "" if machine and machine.has_gpu else "Measures on an NVIDIA GPU; this computer has none."
        )
        if is_moe is None:
            self.form.set_enabled(MOE_KEY, False)
            self.form.set_note(MOE_KEY, "Choose a model to see whether it has experts.")
        elif not is_moe:
            self.form.set_enabled(MOE_KEY, False)
            self.form.set_note(MOE_KEY, "Dense model: no experts to route.")
        else:
            self.form.set_enabled(MOE_KEY, True)
            if self._auto_pick:
                self.form.set_note(MOE_KEY, f"Last run: {self._auto_pick}")
            elif config.speed.moe_backend == "auto":
                self.form.set_note(
                    MOE_KEY,
                    "Auto probes grouped_mm, Triton and PyTorch when the run starts and "
                    "keeps the fastest that works on this GPU.",
                )
            else:
                self.form.set_note(MOE_KEY, "")

        invalid = self.invalid_fields()
        preset = "" if invalid else matching_preset(config)
        for name, button in self.preset_buttons.items():
            button.setChecked(name == preset)
        if invalid:  # the shared config is the last valid one: neither it nor a preset is what the form says
            self.preset_note.setText("Fix the invalid value to compare the settings with the presets.")
            named = f"{', '.join(invalid[:-1])} and {invalid[-1]}" if len(invalid) > 1 else invalid[0]
            self.summary_text.setText(
                f"The form has an invalid value in {named}: fix it to see this run."
                if len(invalid) == 1
                else f"The form has invalid values in {named}: fix them to see this run."
            )
            self._estimate_timer.stop()
            self.memory.show_waiting("Memory: fix the invalid value to see what this run needs.")
        else:
            self.preset_note.setText(PRESETS_BY_NAME[preset].description if preset else "Custom settings.")
            self._show_summary(config)
        # In Basic, a line on the hidden settings that differ from the defaults (or the nearest preset's)
        self.form_choice.show_changes(
            *(hidden_changes(self.form) if self.form.is_basic() and not invalid else ([], ""))
        )
        problems = self.problem_list()
        if not self.form.errors():
            self.state.data_readiness.request(config.data, config.train.method)
        self.problems.setText("\n".join(problems))
        self.problems.setVisible(bool(problems))
        running = self.state.session.is_running
        self.start_button.setEnabled(not problems and not running)
        self.start_button.setText("Training…" if running else "Start training")
        # a running trainer has already read its config: editing it now would change nothing and mislead
        for widget in (self.form, self.load_button, *self.preset_buttons.values(), *self.gpu_boxes):
            widget.setEnabled(not running)
        self.background_box.setEnabled(not running)
        self.form.setToolTip("The settings of the run in progress; edit them once it has ended." if running else "")

    def invalid_fields(self) -> list[str]:
        """The form's labels of the fields holding an invalid value, in the form's order (“Learning rate”); a check
        across a section's fields names the section, one across sections says so."""
        errors = self.form.errors()
        keys = [key for key in self.form.editors if key in errors] + [k for k in errors if k not in self.form.editors]
        names = []
        for key in keys:
            section, _, name = key.partition(".")
            if name:
                names.append(f"“{field_label(key)}”")
            elif section in SECTION_TITLES:
                names.append(f"the “{SECTION_TITLES[section]}” settings")
            else:
                names.append("settings across sections")
        return names

    def _show_summary(self, config: RunConfig) -> None:
        data = config.data.train
        data_text = (
            (
                f"{len(data)} file{'s' if len(data) != 1 else ''}: {', '.join(_short(d) for d in data[:3])}"
                f"{'…' if len(data) > 3 else ''}"
            )
            if data
            else "none"
        )
        steps = (
            f"{config.train.max_steps} steps"
            if config.train.max_steps
            else f"{config.train.epochs:g} epoch{'s' if config.train.epochs != 1 else ''}"
        )
        method = "QLoRA" if config.lora.qlora else "LoRA"
        gpus = self.selected_gpus()
        where = f" · on {len(gpus)} GPUs" if len(gpus) > 1 else ""
        self.summary_text.setText(
            f"<b>{_short(config.model.name_or_path)}</b> · data {data_text} · {method} rank {config.lora.r} · "
            f"{steps} · {config.train.batch_tokens:,} tokens per batch × {config.train.grad_accum}{where}"
        )
        if self.isVisible():  # estimated for the page in view only: loading a model's config is not free
            self._estimate_timer.start()

    def shown(self) -> None:
        super().shown()
        self._estimate_timer.start()
        config = self.state.config  # a file fixed meanwhile is read again
        self.state.data_readiness.request(config.data, config.train.method)

    def _estimate(self) -> None:
        """Predict the run's peak memory in the background; a newer config's estimate replaces an older one."""
        config = self.state.config
        if not self.form.is_valid():  # the shared config is not what the form says; _refresh shows why
            return
        if self.state.model_info is None:  # nothing chosen yet: reading a config would load torch for nothing
            self.memory.show_waiting("Memory: choose a model to see what the run needs.")
            return
        if Task.running():
            # One background job at a time: a first import of transformers on two threads at once can fail (its
            # lazy module is not thread-safe), and the model's inspection or the data check come first anyway.
            self._estimate_timer.start()
            return

        def current(asked=config) -> bool:
            return asked == self.state.config and self.form.is_valid()

        def show(plan):
            if current():
                self.memory.show_plan(plan)
                self.memory.hide_time()

        def show_cpu(found):
            if current():
                self.memory.show_plan(found.plan)
                self.memory.show_time(found.time, found.no_time)

        # The plan reads the model's config (transformers) in the helper process; the machine's free memory is
        # found there too, unless the page was given its own source (tests, a chosen machine). Without a GPU the
        # helper also times the run on this CPU (its matmul rate is measured there, once).
        given = None if self.memory_source is detect_memory else self.memory_source()
        machine = self.state.machine
        if machine is not None and not machine.has_gpu:
            if not self.memory.time_text.text():
                self.memory.show_time(None, "estimating how long this run takes on this CPU…")
            job, args, on_result = in_helper(plan_on_cpu), (config, given, self.cpu_rate), show_cpu
        else:
            job, args, on_result = in_helper(plan_memory), (config, given), show

        def failed(error):
            self.memory.show_failure(error.message)
            self.memory.hide_time()

        self.estimate_task = Task(job, *args, on_result=on_result, on_error=failed)

    def _open_config(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open run config", "", "Run configs (*.toml);;All files (*)")
        if path:
            try:
                self.state.set_config(RunConfig.load(path))
            except ConfigError as e:
                self.problems.setText(str(e))
                self.problems.show()

    def _save_config(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save run config", "run.toml", "Run configs (*.toml)")
        if path:
            self.form.config().save(path)

    def apply_palette(self, palette: Palette) -> None:
        super().apply_palette(palette)
        self.start_button.setIcon(icon("play", "#ffffff", 14))


def _short(name: str) -> str:
    return (
        name.removeprefix("bundled:").replace("\\", "/").rsplit("/", 1)[-1]
        if "/" in name or "\\" in name
        else name.removeprefix("bundled:")
    )
