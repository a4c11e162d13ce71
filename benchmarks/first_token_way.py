"""The first token's way out under load, request by request (measure/first_token.py): for every traced server with
requests alone on the engine at the prompt length it then ran loaded, each loaded point's first tokens against the
update of the step that sampled them (its own) and of the step after, beside what the API server's handling of that
step's outputs would add.

    python benchmarks/first_token_way.py            # the table and the summary
    python benchmarks/first_token_way.py --write    # docs/first-token-way.md, which a test holds to report()
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.first_token import way_out_rows  # noqa: E402
from measure.steps import traced_servers  # noqa: E402
from sizing.planners.step_model import step_overhead  # noqa: E402

PAGE = ROOT / "docs" / "first-token-way.md"


def rows() -> list[dict]:
    fitted = step_overhead()
    out = []
    for server in traced_servers():
        for r in way_out_rows(server, fitted.first_token_s_per_prompt_token, fitted.frontend_api_s_per_token):
            out.append(dict(server=server["tag"], **r))
    return out


def summary(table: list[dict]) -> list[str]:
    own_tighter = sum(r["own_spread_ms"] < r["next_spread_ms"] for r in table)
    bursts = [r for r in table if r["outputs_ms"] >= 5]
    near = sum(abs(r["own_extra_ms"] - r["outputs_ms"]) <= max(3.0, 0.3 * r["outputs_ms"]) for r in bursts)
    return [f"{len(table)} loaded points on {len({r['server'] for r in table})} servers; the first tokens' time past "
            f"their own step's update spreads less than past the next step's on {own_tighter} of them (median "
            f"{statistics.median(r['own_spread_ms'] for r in table):.1f} ms against "
            f"{statistics.median(r['next_spread_ms'] for r in table):.1f} ms); where the step's other outputs come to "
            f"5 ms or more of the API server's time ({len(bursts)} points), the first tokens' lateness past a lone "
            f"request's is that time within 3 ms or 30% on {near}"]


def report() -> str:
    table = rows()
    fitted = step_overhead()
    out = ["# The first token's way out, request by request", "",
           "Written by `python benchmarks/first_token_way.py --write` from the step traces and the load generator's "
           "per-request results kept beside the serving points (`measure/first_token.py`). Each request is matched "
           "to the step that prefilled its prompt's last token (the point's prompts end to end, in the order the "
           "client sent them); its first token's arrival at the client is set against that step's output update "
           "(own) and the next step's (next). The client's clock and the trace's are tied by the same server's "
           "requests alone at the same prompt length: 'past own, beyond alone' is the median first token's time "
           "past its own step's update less a lone request's. 'spread' is the middle 80%'s width of the first "
           "tokens' time past each update: the update that lets a first token out is the one it follows closely. "
           "'outputs' is the API server's time on the step's other outputs, as the fitted terms give it: "
           f"{1e6 * fitted.frontend_api_s_per_token:.2f} us a decoding request's token and "
           f"{1e6 * fitted.first_token_s_per_prompt_token:.2f} us a prompt token of every other first token the "
           "step sampled, shared among the API servers (the median over the point's requests).", "",
           "| server | point | requests | past own, beyond alone ms | spread past own ms | spread past next ms "
           "| outputs ms |",
           "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    out += [f"| {r['server']} | {r['point']} | {r['requests']} | {r['own_extra_ms']:+.1f} | {r['own_spread_ms']:.1f} "
            f"| {r['next_spread_ms']:.1f} | {r['outputs_ms']:.1f} |" for r in table]
    out += ["", "```", *summary(table), "```", ""]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--write":
        tmp = PAGE.with_suffix(".md.tmp")
        tmp.write_text(report())
        tmp.replace(PAGE)
        print(f"wrote {PAGE.relative_to(ROOT)}")
        return 0
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
