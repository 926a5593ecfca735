"""``haepo llm eval-form`` and ``haepo llm eval-score``: the blinded human evaluation."""

from __future__ import annotations

import argparse


def add_parsers(llm_subparsers) -> None:
    """Add ``eval-form`` and ``eval-score`` to the sub-commands of ``haepo llm``."""
    from haepo_ray.cli.args import add_tracking_uri

    form = llm_subparsers.add_parser(
        "eval-form", help="write a blinded human-evaluation form and its key",
        description="Pick posts, take one summary per algorithm and model from the trials' "
                    "generations, shuffle them into numbered slots and write DIR/form.html "
                    "(self-contained, for the raters) and DIR/key.csv (slot -> algorithm, "
                    "model, run; keep it from the raters).")
    form.add_argument("--experiment", metavar="NAME",
                      help="MLflow experiment whose trial runs have generations.jsonl artifacts")
    add_tracking_uri(form)
    form.add_argument("--generations", nargs="+", action="extend", default=[], metavar="FILE",
                      help="generations.jsonl files of `haepo llm train --out DIR` (each file one run)")
    form.add_argument("--out", required=True, metavar="DIR", help="folder for form.html and key.csv")
    form.add_argument("--posts", type=int, default=2, metavar="N", help="posts on the form (default 2)")
    form.add_argument("--seed", type=int, default=0, metavar="S",
                      help="seed of the choice of runs and posts and of the slot order (default 0)")
    form.set_defaults(func=cmd_eval_form)

    score = llm_subparsers.add_parser(
        "eval-score", help="score the answers of a blinded human-evaluation form",
        description="Mean ± std rating per algorithm and model (rows model, columns algorithm) "
                    "and the alignment rate, from the form's key and the raters' exported answers.")
    score.add_argument("--key", required=True, metavar="KEY", help="the form's key.csv")
    score.add_argument("answers", nargs="+", metavar="ANSWERS.csv", help="answers exported from form.html")
    score.set_defaults(func=cmd_eval_score)


def cmd_eval_form(args: argparse.Namespace) -> int:
    from haepo_ray.cli.errors import UsageError
    from haepo_ray.llm.eval_form import generations_from_mlflow, pick_posts, read_generations, write_form
    from haepo_ray.tracking import resolve_tracking_uri

    if not (args.experiment or args.generations):
        raise UsageError("where are the generations? give --experiment NAME (trial runs in MLflow) "
                         "and/or --generations FILE ...")
    try:
        records = [r for path in args.generations for r in read_generations(path)]
        if args.experiment:
            uri = resolve_tracking_uri(args.tracking_uri, create=False)
            records += generations_from_mlflow(args.experiment, uri)
        pages = pick_posts(records, args.posts, args.seed)
    except (ValueError, LookupError) as err:
        raise UsageError(str(err)) from None
    form, key = write_form(pages, args.out)
    print(f"{len(pages)} posts x {len(pages[0].slots)} summaries: give {form} to the raters; "
          f"keep {key} to score their answers with `haepo llm eval-score --key {key} ANSWERS.csv...`")
    return 0


def cmd_eval_score(args: argparse.Namespace) -> int:
    from haepo_ray.cli.errors import UsageError
    from haepo_ray.llm.eval_score import format_scores, read_answers, read_key, score

    try:
        scores = score(read_key(args.key), read_answers(args.answers))
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(format_scores(scores))
    return 0
