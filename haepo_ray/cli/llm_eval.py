"""``haepo llm eval-form`` and ``haepo llm eval-score``: the blinded human evaluation."""

from __future__ import annotations

import argparse


def add_parsers(llm_subparsers) -> None:
    """Add ``eval-form`` and ``eval-score`` to the sub-commands of ``haepo llm``."""
    from haepo_ray.cli.args import add_tracking_uri

    form = llm_subparsers.add_parser(
        "eval-form", help="write blinded human-evaluation forms, one per training seed, and their keys",
        description="Pick posts, take one summary per algorithm and model of each training seed "
                    "from the trials' generations, shuffle them into numbered slots and write, "
                    "per training seed S, DIR/form-seedS.html (self-contained, for that seed's "
                    "raters) and DIR/key-seedS.csv (slot -> algorithm, model, run; keep it from "
                    "the raters). Every form has the same posts.")
    form.add_argument("--experiment", metavar="NAME",
                      help="MLflow experiment whose trial runs have generations.jsonl artifacts")
    add_tracking_uri(form)
    form.add_argument("--generations", nargs="+", action="extend", default=[], metavar="FILE",
                      help="generations.jsonl files of `haepo llm train --out DIR` (each file one run)")
    form.add_argument("--out", required=True, metavar="DIR", help="folder for the forms and keys")
    form.add_argument("--posts", type=int, default=2, metavar="N", help="posts on each form (default 2)")
    form.add_argument("--seeds", type=int, nargs="+", metavar="S",
                      help="training seeds to write forms for (default: every seed of the runs)")
    form.add_argument("--seed", type=int, default=0, metavar="S",
                      help="seed of the choice of posts and runs and of the slot order (default 0)")
    form.set_defaults(func=cmd_eval_form)

    score = llm_subparsers.add_parser(
        "eval-score", help="score the answers to blinded human-evaluation forms",
        description="Mean ± std rating per algorithm and model (rows model, columns algorithm) "
                    "and the alignment rate, per training seed and pooled over seeds, from the "
                    "forms' keys and the raters' exported answers (each matched to its form by "
                    "its form id); the raters' comments go to a CSV file.")
    score.add_argument("--key", required=True, nargs="+", action="extend", metavar="KEY",
                       help="the forms' key-seedS.csv files")
    score.add_argument("--answers", required=True, nargs="+", action="extend", metavar="ANSWERS",
                       help="answers-RATER.csv files exported from the forms")
    score.add_argument("--comments", default="comments.csv", metavar="FILE",
                       help="CSV file for the raters' comments (default comments.csv)")
    score.set_defaults(func=cmd_eval_score)


def cmd_eval_form(args: argparse.Namespace) -> int:
    from haepo_ray.cli.args import check_out_folder
    from haepo_ray.cli.errors import UsageError
    from haepo_ray.llm.eval_form import generations_from_mlflow, pick_forms, read_generations, write_forms
    from haepo_ray.tracking import resolve_tracking_uri

    if not (args.experiment or args.generations):
        raise UsageError("where are the generations? give --experiment NAME (trial runs in MLflow) "
                         "and/or --generations FILE ...")
    check_out_folder(args.out)
    try:
        records = [r for path in args.generations for r in read_generations(path)]
        if args.experiment:
            uri = resolve_tracking_uri(args.tracking_uri, create=False)
            records += generations_from_mlflow(args.experiment, uri)
        forms = pick_forms(records, args.posts, args.seed, args.seeds)
        written = write_forms(forms, args.out)
    except (ValueError, LookupError) as err:
        raise UsageError(str(err)) from None
    keys = []
    for (seed, pages), (form, key) in zip(forms.items(), written):
        keys.append(str(key))
        print(f"training seed {seed}: {len(pages)} posts x {len(pages[0].slots)} summaries: "
              f"give {form} to its raters; keep {key}")
    print(f"score the answers with `haepo llm eval-score --key {' '.join(keys)} --answers ANSWERS.csv...`")
    return 0


def cmd_eval_score(args: argparse.Namespace) -> int:
    from haepo_ray.cli.errors import UsageError
    from haepo_ray.llm.eval_score import format_report, read_answers, read_key, score, write_comments
    from haepo_ray.user_paths import unwritable_file

    problem = unwritable_file(args.comments, "CSV file")  # checked first: it is written after the report
    if problem:
        raise UsageError(f"--comments {args.comments}: {problem}")
    try:
        report = score([read_key(path) for path in args.key], read_answers(args.answers))
    except ValueError as err:
        raise UsageError(str(err)) from None
    print(format_report(report))
    path = write_comments(report, args.comments)
    print(f"{len(report.comments)} comments (the paper's open-ended comments) written to {path}")
    return 0
