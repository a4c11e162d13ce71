"""The listings: `kvsize models`, `gpus`, `formats`, `links` and `support`."""

from __future__ import annotations

import argparse
import json
import sys

from sizing.units import GiB


def add_parser(sub) -> None:
    for name, fn, text in (("models", cmd_models, "bundled model profiles"), ("gpus", cmd_gpus, "bundled GPUs"),
                           ("formats", cmd_formats, "KV cache formats"),
                           ("links", cmd_links, "links between KV tiers (host, disk, remote, peer GPUs)"),
                           ("support", cmd_support, "which KV format each engine runs on each GPU architecture")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
        p.set_defaults(run=fn)


def cmd_models(args: argparse.Namespace) -> int:
    from sizing.profiles import bundled_shape, model_ids, model_profile

    rows = []
    for key in model_ids():
        shape, profile = bundled_shape(key), model_profile(key)
        kinds = {k: shape.layer_kinds.count(k) for k in dict.fromkeys(shape.layer_kinds)}
        rows.append(dict(id=key, name=profile.name, hf_id=profile.hf_id, attention=shape.attention_class,
                         layers=shape.num_layers, layer_kinds=kinds, kv_heads=shape.num_kv_heads,
                         head_dim=shape.head_dim, params=shape.total_params, source=profile.source))
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        kinds = " ".join(f"{k}:{n}" for k, n in r["layer_kinds"].items())
        print(f"{r['id']:<32}{r['attention']:<5}{r['layers']:>4} layers  kv_heads {r['kv_heads']:<4}"
              f"head_dim {r['head_dim']:<5}{r['params'] / 1e9:>8.2f}B params  {kinds}\n"
              f"{'':<32}source: {r['source']}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from sizing.profiles import gpu_ids, gpu_profile

    rows = [dict(id=k, **gpu_profile(k).model_dump()) for k in gpu_ids()]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        fp8 = f"{r['fp8_dense_tflops']:.0f}" if r["fp8_dense_tflops"] else "-"
        print(f"{r['id']:<13}{r['name']:<38}{r['memory_bytes'] / GiB:>7.2f} GiB CUDA total "
              f"(nvidia-smi {r['nvml_memory_mib']} MiB){r['hbm_bandwidth_gb_s']:>7.0f} GB/s  "
              f"bf16 {r['bf16_dense_tflops']:>5.0f}  fp8 {fp8:>5} TFLOP/s  "
              f"${r['price_usd_per_hour']:.2f}/h ({r['price_date']})\n{'':<13}memory: {r['memory_source']}; "
              f"specs: {r['spec_source']}")
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    from sizing.cache.formats import all_formats

    rows = []
    for f in all_formats():
        p, m = f.k.token_bytes(128)
        vp, vm = f.v.token_bytes(128)
        # MLA records hold one latent per token and layer (no K and V per head); others a K and a V per head
        kv = float(p + m) if f.mla_only else float(p + m + vp + vm)
        rows.append(dict(name=f.name, family=f.family, summary=f.summary, engines=list(f.engines),
                         k_bytes_per_token_per_head_at_128=float(p + m), kv_bytes_per_token_per_head_at_128=kv,
                         per="token and layer (one MLA latent record)" if f.mla_only else "token and KV head (K+V)",
                         source=f.source,
                         quality=f.quality, quality_source=f.quality_source,
                         layout_confirmed=not f.unconfirmed, unconfirmed=f.unconfirmed))
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        unit = "B/token/layer (MLA record)" if r["per"].startswith("token and layer") else "B/token/head (K+V, head_dim 128)"
        print(f"{r['name']:<21}{r['kv_bytes_per_token_per_head_at_128']:>7.1f} {unit}  "
              f"{r['summary']}\n{'':<21}engines: {', '.join(r['engines'])}; layout: {r['source']}"
              + (f"\n{'':<21}layout unconfirmed: {r['unconfirmed']}" if r["unconfirmed"] else ""))
    return 0


def cmd_links(args: argparse.Namespace) -> int:
    from sizing.profiles import link_ids, link_profile

    rows = [dict(id=k, **link_profile(k).model_dump()) for k in link_ids()]
    if args.format == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    for r in rows:
        shared = "shared by the node's GPUs" if r["shared_by_gpus"] else "one per GPU"
        print(f"{r['id']:<15}{r['bandwidth_gb_s']:>8g} GB/s {r['latency_us']:>6g} us  {r['kind']:<7}{shared}\n"
              f"{'':<15}{r['name']}; {r['source']}")
    return 0


def cmd_support(args: argparse.Namespace) -> int:
    from sizing.engines import ENGINES, engine_formats
    from sizing.profiles import gpu_ids, gpu_profile
    from sizing.engines.support import support

    architectures = sorted({gpu_profile(g).architecture for g in gpu_ids()})
    rows = [dict(engine=engine, format=fmt, architecture=arch, **vars(support(engine, fmt, arch)))
            for engine in ENGINES if engine != "ideal" for fmt in engine_formats(engine)
            for arch in architectures]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    mark = {"supported": "yes", "unsupported": "no", "unconfirmed": "?"}
    print(f"{'engine':<10}{'format':<22}" + "".join(f"{a:>8}" for a in architectures))
    for i in range(0, len(rows), len(architectures)):
        cells = rows[i:i + len(architectures)]
        print(f"{cells[0]['engine']:<10}{cells[0]['format']:<22}" + "".join(f"{mark[c['status']]:>8}" for c in cells))
    print("yes: supported, no: unsupported, ?: unconfirmed; sources: kvsize support --format json")
    return 0
