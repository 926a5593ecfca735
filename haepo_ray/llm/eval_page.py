"""``form.html`` of the blinded human evaluation: one self-contained page (inline CSS and
script, no network), one page per post, shown one at a time.

Per post: what the models were given, the instruction and the source as cut for them (not the
whole source: the models never saw the rest), and its summaries labelled by slot number only;
per summary a rating
on the paper's scale (:data:`SCALE`), a radio button "closest to the author's TL;DR" (one
choice per post: the rater's A/B vote) and an optional free-text comment. The author's TL;DR
itself is not shown. Nothing names an algorithm, model, run or seed; every text is
HTML-escaped. The page says which questions are the paper's and which this project added
(:data:`ORIGIN`, :data:`ORIGIN_NOTE`).

"Export answers" downloads ``answers-<rater>.csv`` (refused, with a list of what is missing,
until every rating and vote and the rater id are answered), one row per post x slot::

    form_id,rater,post,slot,rating,closest,comment

``form_id`` ties the answers to the key of this form, ``rating`` is 1-5, ``closest`` is 1 on
the slot chosen as closest to the author's TL;DR on that post and 0 on the others,
``comment`` the rater's comment on that summary (empty when none).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from html import escape
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from haepo_ray.llm.eval_form import Post

SCALE = {1: "Poor", 2: "Fair", 3: "Good", 4: "Very Good", 5: "Excellent"}
SCALE_TEXT = ", ".join(f"{n} {label}" for n, label in SCALE.items())
EMPTY_SUMMARY = "(this summary is empty: the system wrote nothing)"  # rated like any other
ANSWER_COLUMNS = ("form_id", "rater", "post", "slot", "rating", "closest", "comment")
# Where each question comes from. The paper's questionnaire (appendix "Human Evaluation Form")
# rates every summary 1-5, and its "Qualitative Feedback" quotes open-ended comments; its
# alignment rate counts "human A/B votes", but its form shows no such question: the
# "closest to the author's TL;DR" vote, scored by ROUGE-L, is this project's.
ORIGIN = {"rating": "paper", "comment": "paper", "closest": "project"}
# Names no algorithm (the paper's name is one): the raters stay blind.
ORIGIN_NOTE = ("The 1-5 rating and the comments are the questions of the paper this evaluation "
               "repeats (its appendix \"Human Evaluation Form\" and the open-ended comments of its "
               "\"Qualitative Feedback\"); the vote for the summary closest to the author's TL;DR "
               "was added by this project.")

_CSS = """
body{font:16px/1.5 system-ui,sans-serif;max-width:52rem;margin:0 auto;padding:1rem 1rem 6rem;color:#222}
blockquote{white-space:pre-wrap;background:#f5f5f5;border-left:4px solid #888;margin:0;padding:.75rem 1rem}
.summary{border:1px solid #ccc;border-radius:6px;padding:.5rem 1rem;margin:1rem 0}
.summary p{white-space:pre-wrap;font-style:italic}
.summary p.empty{font-style:normal;color:#777}
.scale label,.closest{margin-right:1rem;white-space:nowrap}
label.comment{display:block;margin-top:.5rem}
label.comment textarea{display:block;width:100%;box-sizing:border-box;font:inherit}
.origin{color:#555;font-size:.9em}
footer{position:fixed;bottom:0;left:0;right:0;background:#fff;border-top:1px solid #ccc;padding:.5rem 1rem}
#status{color:#a00}
@media print{section[hidden]{display:block}section{page-break-after:always}footer{position:static}}
"""

_SCRIPT = """
const pages = Array.from(document.querySelectorAll('section.post'));
const formId = document.body.dataset.form;
let current = 0;
function show(i) {
  current = i;
  pages.forEach((page, k) => { page.hidden = k !== i; });
  document.getElementById('page-no').textContent = 'Post ' + (i + 1) + ' of ' + pages.length;
  document.getElementById('prev').disabled = i === 0;
  document.getElementById('next').disabled = i === pages.length - 1;
  window.scrollTo(0, 0);
}
function csvField(value) {
  value = String(value);
  return /[",\\r\\n]/.test(value) ? '"' + value.replace(/"/g, '""') + '"' : value;
}
function exportAnswers() {
  const rater = document.getElementById('rater').value.trim();
  const missing = rater ? [] : ['your rater id'];
  const rows = [COLUMNS];
  for (const page of pages) {
    const post = page.dataset.post;
    const chosen = page.querySelector('input.closest-choice:checked');
    if (!chosen) missing.push('post ' + post + ': the summary closest to the author\\'s TL;DR');
    for (const summary of page.querySelectorAll('.summary')) {
      const slot = summary.dataset.slot;
      const rating = summary.querySelector('input.rating:checked');
      if (!rating) missing.push('post ' + post + ', summary ' + slot + ': a rating');
      rows.push([formId, rater, post, slot, rating ? rating.value : '',
                 chosen && chosen.value === slot ? 1 : 0,
                 summary.querySelector('textarea.comment').value.trim()]);
    }
  }
  const status = document.getElementById('status');
  if (missing.length) { status.textContent = 'Not exported; missing: ' + missing.join('; '); return; }
  const csv = rows.map(row => row.map(csvField).join(',')).join('\\r\\n') + '\\r\\n';
  const link = document.createElement('a');
  link.href = URL.createObjectURL(new Blob([csv], {type: 'text/csv'}));
  link.download = 'answers-' + rater.replace(/[^A-Za-z0-9_-]+/g, '_') + '.csv';
  document.body.appendChild(link);
  link.click();
  link.remove();
  status.textContent = 'Exported ' + (rows.length - 1) + ' answers to ' + link.download;
}
document.getElementById('prev').onclick = () => show(current - 1);
document.getElementById('next').onclick = () => show(current + 1);
document.getElementById('export').onclick = exportAnswers;
show(0);
"""


def render_form(pages: Sequence[Post], form_id: str) -> str:
    """The whole page; ``form_id`` (see :func:`haepo_ray.llm.eval_form.key_rows`) goes into the
    exported answers."""
    slots = len(pages[0].slots)
    sections = "\n".join(_section(p, page) for p, page in enumerate(pages, 1))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Summary evaluation</title>
<style>{_CSS}</style></head>
<body data-form="{escape(form_id)}">
<h1>Summary evaluation</h1>
<p>You will be shown {len(pages)} posts, one per page: a text and the instruction its summaries
were written to, exactly as the writers were given them. Read them, then rate each of its
{slots} summaries on the scale {SCALE_TEXT}, pick the one summary you think is closest
to the TL;DR the author would write, and, if you like, comment on any summary. The summaries
are shuffled; you are not told who or what wrote them.</p>
<p class="origin">About the questions: {escape(ORIGIN_NOTE)}</p>
<p>When you are done, enter your rater id below and press <b>Export answers</b>: it downloads
a CSV file of your answers; send that file back.</p>
{sections}
<footer>
<button type="button" id="prev">Previous</button>
<span id="page-no"></span>
<button type="button" id="next">Next</button>
<label>Rater id <input type="text" id="rater" autocomplete="off"></label>
<button type="button" id="export">Export answers</button>
<div id="status" role="status"></div>
</footer>
<script>const COLUMNS = {json.dumps(list(ANSWER_COLUMNS))};{_SCRIPT}</script>
</body></html>
"""


def _section(post: int, page: Post) -> str:
    summaries = "\n".join(_summary(post, slot, gen.completion)
                          for slot, gen in enumerate(page.slots, 1))
    return f"""<section class="post" data-post="{post}">
<h2>Post {post}</h2>
<p class="instruction">The instruction: <b>{escape(page.instruction)}</b></p>
<blockquote>{escape(page.shown_source)}</blockquote>
{summaries}
</section>"""


def _summary(post: int, slot: int, text: str) -> str:
    ratings = "".join(
        f'<label><input type="radio" class="rating" name="rating-{post}-{slot}" value="{n}"> '
        f"{n} {label}</label>" for n, label in SCALE.items())
    shown = f"<p>{escape(text)}</p>" if text.strip() else f'<p class="empty">{EMPTY_SUMMARY}</p>'
    return f"""<div class="summary" data-slot="{slot}">
<h3>Summary {slot}</h3>
{shown}
<div class="scale" data-origin="{ORIGIN["rating"]}">{ratings}</div>
<label class="closest" data-origin="{ORIGIN["closest"]}"><input type="radio" class="closest-choice" name="closest-{post}" value="{slot}">
Closest to the author's TL;DR (one per post)</label>
<label class="comment" data-origin="{ORIGIN["comment"]}">Comments on summary {slot} (optional)
<textarea class="comment" name="comment-{post}-{slot}" rows="2"></textarea></label>
</div>"""
