"""Benchmark fk.multi_tensor_norm / fk.multi_tensor_count_zeros (one kernel over a list of
tensors) against torch's gradient-norm paths.

    python benchmarks/benchmark_multi_tensor_norm.py --dtype bf16
    python benchmarks/benchmark_multi_tensor_norm.py --device cpu --scale 64 --rep 20   # smoke

The list: the parameter shapes of a Llama-3.2-1B-like model (vocab 128256, hidden 2048,
intermediate 8192, 16 layers, 32 query / 8 key-value heads of 64; embeddings, 7 matrices
and 2 norm weights a layer, the final norm): 146 tensors, 1.24 billion elements (2.47 GB in
bf16). --scale k divides every width by k. Providers:

  fk                    fk.multi_tensor_norm(ts, ord) (count: fk.multi_tensor_count_zeros)
  get_total_norm        torch.nn.utils.get_total_norm(ts, ord) (torch._foreach_norm per
                        device and dtype, then the norm of the norms)
  _foreach_norm         torch.linalg.vector_norm(torch.stack(torch._foreach_norm(ts, ord)))
  per tensor            the same from one vector_norm per tensor (foreach=False)
  (count) torch         torch.stack([(t == 0).sum() for t in ts]).sum()

Columns: us, GB/s of the bytes read, that as a fraction of the copy bandwidth (measured,
read + write counted), and the time against fk. linghe's H800 figures (batch grad norm
1413.7 us, batch count zero 746.8 us; shapes not published) are printed scaled by the copy
bandwidths for reference.
"""
import argparse

import torch

import _harness as H

H800_COPY_BW = 3.35e12
LINGHE_US = {"norm": 1413.7, "count_zeros": 746.8}


def llama_shapes(scale=1):
    v, h, i, layers, hd, q, kv = 128256, 2048, 8192, 16, 64, 32, 8
    v, h, i, hd = v // scale, h // scale, i // scale, max(1, hd // scale)
    shapes = [(v, h)]
    for _ in range(layers):
        shapes += [(q * hd, h), (kv * hd, h), (kv * hd, h), (h, q * hd), (i, h), (i, h),
                   (h, i), (h,), (h,)]
    return shapes + [(h,)]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", default="bf16", choices=sorted(H.DTYPES))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--scale", type=int, default=1)
    p.add_argument("--warmup", type=float, default=25.0)
    p.add_argument("--rep", type=float, default=200.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--copy-bw", type=float, default=None, help="B/s (default: measured)")
    args = p.parse_args()
    import fk

    device, dtype = torch.device(args.device), H.DTYPES[args.dtype]
    g = torch.Generator(device=device).manual_seed(0)
    ts = [torch.randn(s, device=device, dtype=dtype, generator=g) for s in llama_shapes(args.scale)]
    for t in ts[::3]:
        t.view(-1)[::5] = 0
    nbytes = sum(t.numel() * t.element_size() for t in ts)
    copy_bw = args.copy_bw or H.measure_copy_bw(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{gpu}; torch {torch.__version__}; {len(ts)} tensors, "
          f"{sum(t.numel() for t in ts) / 1e9:.3f} G elements {args.dtype} ({nbytes / 1e9:.2f} GB); "
          f"copy bandwidth {copy_bw / 1e12:.2f} TB/s; {args.rounds} rounds (median)")

    def norms(ord):
        return {
            "fk": lambda: fk.multi_tensor_norm(ts, ord),
            "get_total_norm": lambda: torch.nn.utils.get_total_norm(ts, ord),
            "_foreach_norm": lambda: torch.linalg.vector_norm(
                torch.stack(torch._foreach_norm(ts, ord)), ord),
            "per tensor": lambda: torch.nn.utils.get_total_norm(ts, ord, foreach=False),
        }

    counts = {"fk": lambda: fk.multi_tensor_count_zeros(ts),
              "torch": lambda: torch.stack([(t == 0).sum() for t in ts]).sum()}
    # correctness first: every provider agrees (torch's norms of 16-bit tensors come back
    # rounded to their dtype; fk's are float32)
    tol = 1e-4 if dtype == torch.float32 else 8e-3
    for ord in (2.0, float("inf")):
        vals = {n: f().item() for n, f in norms(ord).items()}
        assert all(abs(v - vals["fk"]) <= tol * abs(vals["fk"]) for v in vals.values()), vals
    assert counts["fk"]().item() == counts["torch"]().item()

    for name, fns, linghe in (("norm ord=2", norms(2.0), LINGHE_US["norm"]),
                              ("norm ord=inf", norms(float("inf")), LINGHE_US["norm"]),
                              ("count_zeros", counts, LINGHE_US["count_zeros"])):
        times = H.time_rounds({n: (f, ()) for n, f in fns.items()}, device, args)
        ms = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
        print(f"\n{name}: linghe's H800 time scaled to this GPU "
              f"{linghe * H800_COPY_BW / copy_bw:.1f} us (its shapes unknown)")
        print(f"{'provider':<18}{'us':>10}{'GB/s':>10}{'of copy bw':>12}{'vs fk':>8}")
        for n, v in ms.items():
            bw = nbytes / (v * 1e-3)
            print(f"{n:<18}{v * 1e3:>10.1f}{bw / 1e9:>10.0f}{bw / copy_bw:>12.2f}"
                  f"{v / ms['fk']:>8.2f}")
        for line in H.rounds_note(times):
            print("  " + line)


if __name__ == "__main__":
    main()
