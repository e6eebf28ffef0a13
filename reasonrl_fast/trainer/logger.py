"""Metrics sinks: metrics.jsonl (always), TensorBoard, wandb (trainer.logger=wandb, if installed),
and a rich progress bar with the key figures."""

from __future__ import annotations

import json
import math
import os
import warnings

from reasonrl_fast.util import read_metrics


class MetricsLogger:
    def __init__(self, cfg, output_dir: str, start_step: int, total_steps: int):
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self._truncate_after(start_step)  # a killed run may have logged past its last checkpoint
        self.tb = self.wandb = self.progress = None
        if cfg.trainer.logger in ("tensorboard", "wandb"):
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(os.path.join(output_dir, "tensorboard"))
        if cfg.trainer.logger == "wandb":
            try:
                import wandb

                self.wandb = wandb.init(project=cfg.trainer.project, dir=output_dir, resume="allow")
            except ImportError:
                warnings.warn("trainer.logger=wandb but wandb is not installed; TensorBoard only", stacklevel=2)
        if cfg.trainer.progress:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), TextColumn("{task.fields[info]}"))
            self.task = self.progress.add_task(cfg.algo, total=total_steps, completed=start_step, info="")
            self.progress.start()

    def _truncate_after(self, step: int) -> None:
        if not os.path.exists(self.path):
            return
        rows = read_metrics(self.path)
        with open(self.path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows if r["step"] <= step)

    def log(self, metrics: dict) -> None:
        step = metrics["step"]
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        with open(self.path, "a") as f:
            f.write(json.dumps(clean) + "\n")
        if self.tb is not None:
            for k, v in metrics.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tb.add_scalar(k, v, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)
        if self.progress is not None:
            info = " ".join(f"{k.split('/')[0]}={metrics[k]:.3g}" for k in ("reward/mean", "val/accuracy", "time/step_s")
                            if isinstance(metrics.get(k), (int, float)))
            self.progress.update(self.task, completed=step, info=info)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
