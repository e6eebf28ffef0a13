"""Checks of a tensor-parallel vllm rollout engine that run inside the vLLM venv
(tests/rollout/test_vllm_tp.py starts this file there). Each check raises on failure; the last line
printed is "ok" when all passed.

    python vllm_tp_checks.py WORK ref
        saves two tiny Qwen2 models (fp32) into WORK, runs the one-process engine (TP=1) over the
        first and writes what it sampled to WORK/ref.json
    python vllm_tp_checks.py WORK rank R PORT      (R = 0 and 1, started together)
        one rank of a TP=2 engine over the same model, in a gloo group of two processes formed as
        the trainer's workers form theirs (rendezvous on 127.0.0.1:PORT); checks its samples
        against ref.json and against the other rank's

Both runs call the project's VLLMEngine with the same prompts and seeds in the same order (the
ranks of an engine are called alike) and record: greedy samples, seeded temperature-1 samples,
seeded temperature-0.7 / top-p 0.9 samples, the same after a weight sync with the second model's
full state dict (the (name, tensor) pairs the trainer's sync feeds), and after a sync back to
the first. A TP=2 rank must return the TP=1 engine's tokens exactly and its log-probs within 1e-4
(the ranks sum partial products in another order than one process does), both ranks the same
output, and each rank hold about half of the TP=1 engine's parameters. The peak RSS of each
process is printed beside the TP=1 engine's (not checked: at this size the libraries are
nearly all of it; benchmarks/bench_vllm_tp.py measures it on a larger model)."""

import json
import os
import resource
import sys

import torch

V, EOS = 64, 2  # vLLM pads the vocabulary to a multiple of 64: none here, so no padding rows count
LOGPROB_TOL = 1e-4


def model(seed: int):
    from tests.rollout.vllm_engine_checks import model as tiny

    return tiny(seed, vocab=V, intermediate=256)


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def engine_params(engine) -> int:
    """The weights this process's rank of the engine holds: its model's parameters, where vLLM's
    CPU linear layers count by the shape of their part (after loading they hand their weight to a
    packed oneDNN copy and keep an empty parameter in its place)."""
    model = engine.llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    held = 0
    for module in model.modules():
        for p in module.parameters(recurse=False):
            held += p.numel()
        weight = getattr(module, "weight", None)
        if weight is not None and weight.numel() == 0 and hasattr(module, "output_partition_sizes"):
            held += sum(module.output_partition_sizes) * module.input_size_per_partition
    return held


def sample_all(engine, work: str) -> dict:
    """Every sampling of the checks, in a fixed order, with its tokens and log-probs."""
    from transformers import Qwen2ForCausalLM

    from reasonrl_fast.rollout import sample_seeds

    prompts = [[5, 9, 11], [7], [3, 4, 5, 6, 7, 8]]
    seeds = sample_seeds(0, 1, 0, 12)
    out = {}

    def record(name, n, temperature, top_p, max_new):
        s = engine.generate(prompts, n, temperature, top_p, max_new, seeds[:len(prompts) * n])
        out[name] = {"tokens": s.tokens, "logprobs": s.logprobs}

    def sampled():
        record("greedy", 1, 0.0, 1.0, 16)
        record("t1", 4, 1.0, 1.0, 24)
        record("t0.7_p0.9", 4, 0.7, 0.9, 24)

    sampled()
    out = {f"first/{k}": v for k, v in out.items()}
    # the sync as the trainer feeds it: full tensors by name; each rank's loaders take their part
    second = Qwen2ForCausalLM.from_pretrained(os.path.join(work, "second"), dtype=torch.float32)
    engine.load_weights((name, p.detach()) for name, p in second.named_parameters())
    done, out = out, {}
    sampled()
    done.update({f"second/{k}": v for k, v in out.items()})
    first = Qwen2ForCausalLM.from_pretrained(os.path.join(work, "first"), dtype=torch.float32)
    engine.load_weights((name, p.detach()) for name, p in first.named_parameters())
    out = {}
    sampled()
    done.update({f"back/{k}": v for k, v in out.items()})
    return done


def build(work: str, tp: int, rank: int = 0):
    from reasonrl_fast.rollout.vllm import VLLMEngine

    # 32 blocks of 128 tokens at 2 x 2 layers x (2 / tp) kv heads x 32 x 4 bytes a token: every batch at once
    kv_bytes = 32 * 128 * 2 * 2 * (2 // tp) * 32 * 4
    return VLLMEngine(os.path.join(work, "first"), torch.float32, EOS, max_model_len=96, seed=0,
                       device=torch.device("cpu"), log_path=os.path.join(work, f"vllm-tp{tp}-rank{rank}.log"),
                       kv_cache_memory_bytes=kv_bytes, tensor_parallel_size=tp, local_rank=rank)


def reference(work: str) -> None:
    for seed, name in [(0, "first"), (1, "second")]:
        model(seed).save_pretrained(os.path.join(work, name))
    engine = build(work, 1)
    params = engine_params(engine)
    assert params == sum(p.numel() for p in model(0).parameters()), params  # the count counts every weight
    results = sample_all(engine, work)
    engine.close()
    assert any(t[-1] == EOS for t in results["first/t1"]["tokens"]), "no response ended with EOS"
    # the checks compare something: the second model samples otherwise than the first
    assert results["second/t1"]["tokens"] != results["first/t1"]["tokens"]
    assert results["back/t1"] == results["first/t1"]
    with open(os.path.join(work, "ref.json"), "w") as f:
        json.dump({"params": params, "results": results, "peak_rss_mib": peak_rss_mib()}, f)
    print(f"TP=1: {params} parameters, peak RSS {peak_rss_mib():.0f} MiB", flush=True)
    print("ok", flush=True)


def compare(results: dict, ref: dict, who: str) -> None:
    assert results.keys() == ref.keys(), (who, sorted(results), sorted(ref))
    for name, want in ref.items():
        got = results[name]
        assert got["tokens"] == want["tokens"], (who, name, got["tokens"], want["tokens"])
        err = max((abs(a - b) for x, y in zip(got["logprobs"], want["logprobs"]) for a, b in zip(x, y)), default=0.0)
        assert err < LOGPROB_TOL, (who, name, err)
        print(f"{who} {name}: tokens equal, log-probs within {err:.1e}", flush=True)


def rank_main(work: str, rank: int, port: int) -> None:
    import torch.distributed as dist

    from reasonrl_fast.runtime.distributed import init_process_group

    world = 2
    # as the trainer's workers are set up: the gloo group over a TCPStore, RANK, WORLD_SIZE,
    # MASTER_ADDR and MASTER_PORT left in the environment, then the engine
    init_process_group(rank, world, "127.0.0.1", port, timeout_s=300)
    with open(os.path.join(work, "ref.json")) as f:
        ref = json.load(f)
    engine = build(work, 2, rank)
    params = engine_params(engine)
    results = sample_all(engine, work)
    # both ranks return the engine's whole output, the same on each (gathered before the engine
    # closes: vLLM's shutdown destroys the default process group too)
    both = [None] * world
    dist.all_gather_object(both, results)
    engine.close()
    compare(results, ref["results"], f"rank {rank}")
    assert both[0] == both[1], "the two ranks returned different samples"
    print(f"rank {rank}: both ranks' outputs identical", flush=True)
    # each rank holds its half of every split weight; only the norms' few weights are whole on both
    share = params / ref["params"]
    print(f"rank {rank}: {params} of {ref['params']} parameters ({share:.3f}); peak RSS "
          f"{peak_rss_mib():.0f} MiB against {ref['peak_rss_mib']:.0f} MiB for TP=1", flush=True)
    assert 0.49 < share < 0.52, share
    if dist.is_initialized():
        dist.destroy_process_group()
    print("ok", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)  # before the engine: vLLM's CPU worker refuses later changes
    work, mode = sys.argv[1], sys.argv[2]
    if mode == "ref":
        reference(work)
    elif mode == "rank":
        rank_main(work, int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(f"unknown mode {mode!r}: ref or rank")
