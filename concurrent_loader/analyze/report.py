"""The text report of an :class:`~concurrent_loader.analyze.Analysis`, and its plot of rate
against cores (matplotlib, imported only to draw it)."""

from __future__ import annotations

import os

from ..metrics.predict import Recommendation, Setting
from . import Analysis

__all__ = ["format_report", "plot_rates", "write_outputs"]


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def format_report(result: Analysis) -> str:
    rates, rec = result.rates, result.recommendation
    if rates is None or rec is None:
        raise ValueError("the analysis has no prediction")
    unit = "img/s" if result.kind == "images" else "obj/s"
    lines = [
        f"analyze {result.root}: {result.objects} {result.kind} "
        f"({_mb(result.dataset_bytes)}, {_mb(rates.sample_bytes)} each), {result.cpus} cores, "
        f"batch {result.batch_size}, measured in {result.seconds:.1f} s",
        "ingest (fetch only, one process):",
    ]
    for n, run in result.ingest.items():
        what = f"{n} requests in flight" if result.remote else f"{n} reading threads"
        lines.append(f"  {what:>24}: {run.rate:8.0f} obj/s {run.bytes_per_s / 1e6:8.1f} MB/s")
    if result.remote:
        lines.append(f"  GET latency (Little's law): {rates.latency_s * 1000:.0f} ms")
    lines.append("decode (bytes in memory, one process):")
    for t, rate in result.decode.items():
        lines.append(f"  {t:>3} threads: {rate:8.0f} {unit} ({rate / t:.0f} per thread)")
    lines.append("end to end (measured / model at its pipeline efficiency):")
    for setting, run in result.end_to_end:
        lines.append(
            f"  {setting.workers:>3} workers x {setting.decode_threads} threads: "
            f"{run.rate:8.0f} / {rates.loader_rate(setting):8.0f} {unit} "
            f"({rates.bottleneck(setting)} bound, efficiency {rates.efficiency_at(setting):.2f})"
        )
    if result.cache is not None:
        cache = result.cache
        hits = cache["hit_share"]
        lines.append(
            f"cache (budget {_mb(cache['budget_bytes'])}, {cache['budget_share']:.0%} of the "
            f"dataset): hits {cache['hit_rate_per_s']:.0f} obj/s fetch only"
            f"{'' if hits is None else f' ({hits:.0%} of reads hit)'}; "
            f"predicted {cache['predicted_per_s']:.0f} {unit} at the recommended setting"
        )
    lines.append(f"prediction: {rec.rate:.0f} {unit} with {rec.setting} ({rec.bottleneck} bound)")
    if result.step_rate is not None and rec.stall is not None:
        lines.append(
            f"step: {result.step_rate:.0f} {unit} -> predicted data stall "
            f"{rec.stall:.0%} of step time"
        )
    lines.append(_advice(result, rec))
    return "\n".join(lines)


def _advice(result: Analysis, rec: Recommendation) -> str:
    setting = rec.setting
    loader = (
        f"ConcurrentDataLoader(num_workers={setting.workers}, "
        f"decode_threads={setting.decode_threads})"
    )
    if result.remote:
        loader += f", FetchConfig(max_inflight_requests={setting.inflight})"
    if not result.remote:
        cache = "no cache (a local directory)"
    elif rec.cache_budget_bytes:
        cache = f"CacheConfig(max_bytes={rec.cache_budget_bytes}) ({rec.cache_share:.0%} of it)"
    else:
        cache = "no cache needed (the storage keeps up)"
    return f"recommend: {loader}; {cache}"


def plot_rates(result: Analysis, path: str) -> None:
    """Measured end-to-end rates against cores used, with the model's decode and ingest
    lines and the step rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = result.rates
    if rates is None:
        raise ValueError("the analysis has no prediction")
    cores = list(range(1, result.cpus + 1))
    inflight = result.end_to_end[0][0].inflight if result.end_to_end else 64
    fig, ax = plt.subplots(figsize=(6, 4))
    try:
        ax.plot(
            cores,
            [rates.decode_at(Setting(c, 1, inflight)) for c in cores],
            label="decode (model)",
            linestyle="--",
        )
        ax.plot(
            cores,
            [rates.ingest_at(Setting(c, 1, inflight)) for c in cores],
            label=f"ingest, {inflight} in flight per worker (model)",
            linestyle=":",
        )
        ax.plot(
            cores,
            [rates.loader_rate(Setting(c, 1, inflight)) for c in cores],
            label="loader (model)",
        )
        ax.scatter(
            [s.cores for s, _ in result.end_to_end],
            [run.rate for _, run in result.end_to_end],
            label="loader (measured)",
            color="black",
            zorder=3,
        )
        if result.step_rate is not None:
            ax.axhline(result.step_rate, color="red", label="training step")
        ax.set_xticks(cores)
        ax.set_xlabel("cores (workers x decode threads)")
        ax.set_ylabel("samples/s")
        ax.set_title(result.root, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)


def write_outputs(result: Analysis, directory: str) -> tuple[str, str]:
    """``report.txt`` and ``rate.png`` in ``directory`` (made if missing); their paths."""
    os.makedirs(directory, exist_ok=True)
    text_path = os.path.join(directory, "report.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(format_report(result) + "\n")
    png_path = os.path.join(directory, "rate.png")
    plot_rates(result, png_path)
    return text_path, png_path
