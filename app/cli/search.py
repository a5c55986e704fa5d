"""`llamatui search TEXT`: GGUF repositories on the Hugging Face Hub; with --files, one repo's
quantizations and whether this machine can run them."""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from .ls import human_bytes, human_count
from .flags import add_ctx_size, checked


def add_arguments(p):
    p.add_argument("query", nargs="?", default=None,
                   help="text to look for in repository names; or owner/repo with --files")
    p.add_argument("--sort", default="downloads",
                   choices=("downloads", "likes", "trending_score", "last_modified",
                            "created_at"), help="order of the results (default: downloads)")
    p.add_argument("-n", "--limit", type=checked(int, lambda v: 1 <= v <= 1000,
                                                 "must be between 1 and 1000"),
                   default=20, metavar="N",
                   help="number of repositories to list (default: 20, at most 1000)")
    p.add_argument("--files", action="store_true",
                   help="list the GGUF files of repository QUERY by quantization, with a "
                        "memory estimate for this machine")
    add_ctx_size(p, 4096, what="context size for the memory estimate (with --files)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")


def run(args):
    from llamatui.models import hub
    if args.files:
        if not args.query:
            raise ValueError("--files needs a repository: llamatui search --files owner/repo")
        return _files(args, hub)
    models = hub.search_models(args.query, sort=args.sort, limit=args.limit)
    if args.json:
        print(json.dumps([m.__dict__ for m in models], indent=1, default=str))
        return 0
    console = Console()
    if not models:
        console.print(f"No GGUF repositories match {args.query!r}.")
        return 0
    table = Table(title=f"GGUF models on {hub.hub_endpoint()}" +
                  (f" matching {args.query!r}" if args.query else ""), title_justify="left")
    table.add_column("REPOSITORY")
    table.add_column("DOWNLOADS", justify="right")
    table.add_column("LIKES", justify="right")
    table.add_column("UPDATED")
    table.add_column("ENGINE")
    table.add_column("")
    for m in models:
        table.add_row(m.id, human_count(m.downloads) if m.downloads else "0",
                      str(m.likes or 0), (m.last_modified or "")[:10], engine_label(m),
                      "gated" if m.gated else "")
    console.print(table)
    console.print("[dim]llamatui search --files OWNER/REPO lists a repository's "
                  "quantizations; llamatui pull OWNER/REPO[:QUANT] downloads one[/]")
    return 0


def engine_label(model) -> str:
    """ENGINE column: whether llamatui runs the repository's architecture."""
    runs = model.engine_runs
    if runs is None:
        return "?"
    return "runs" if runs else f"no ({model.architecture})"


def _files(args, hub):
    from llamatui.models.hardware import detect
    from llamatui.models.recommend import recommend
    listing = hub.list_files(args.query)
    rec = recommend(listing, detect(), n_ctx=args.ctx_size)
    by_quant = {f.quant: f for f in rec.fits}
    if args.json:
        print(json.dumps({
            "repo": listing.repo, "revision": listing.revision, "offline": listing.offline,
            "gguf": listing.gguf.raw if listing.gguf else None,
            "best": rec.best.quant if rec.best else None,
            "groups": [{"quant": g.quant, "size": g.size, "files": [f.path for f in g.files],
                        "supported": g.supported,
                        "fit": by_quant[g.quant].label if g.quant in by_quant else None,
                        "estimate": by_quant[g.quant].estimate.as_dict()
                        if g.quant in by_quant else None} for g in listing.groups],
            "mmproj": [f.path for f in listing.mmproj],
            "imatrix": [f.path for f in listing.imatrix]}, indent=1))
        return 0
    console = Console()
    info = listing.gguf
    head = f"{listing.repo}"
    if info:
        head += (f": {info.architecture or '?'}, {human_count(info.parameters)} parameters, "
                 f"context {info.context_length or '?'}")
    if listing.offline:
        head += " [yellow](offline: what the store holds)[/]"
    table = Table(title=head, title_justify="left")
    for col in ("QUANT", "SIZE", "FILES", "MEMORY", "ON THIS MACHINE", ""):
        table.add_column(col, justify="right" if col in ("SIZE", "MEMORY") else "left")
    for g in listing.groups:
        fit = by_quant.get(g.quant)
        mark = "[green]← recommended[/]" if rec.best is not None and fit is rec.best else ""
        if g.supported is False:
            mark = "[dim]not supported by the engine[/]"
        table.add_row(g.quant, human_bytes(g.size),
                      str(len(g.files)) if g.split else "1",
                      human_bytes(fit.estimate.total_bytes) if fit else "?",
                      fit.label if fit else "?", mark)
    console.print(table)
    for f in listing.mmproj:
        console.print(f"[dim]multimodal projector: {f.path} ({human_bytes(f.size)})[/]")
    for note in rec.notes:
        console.print(f"[dim]{note}[/]")
    console.print(f"[dim]memory at context {rec.n_ctx} (from the {rec.shape_source}); "
                  f"llamatui pull {listing.repo}:QUANT downloads one[/]")
    return 0
