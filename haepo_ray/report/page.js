// The report page's behaviour (haepo_ray/report/page.py inlines it): draws each chart of the
// JSON block #haepo-charts with Plotly (plotly.min.js beside the page; without it, the PNGs),
// sorts a table by the header clicked, filters a results table by the words typed, and
// highlights the curves of the results rows ticked. Nothing is fetched from the network.
(function () {
  "use strict";
  const charts = JSON.parse(document.getElementById("haepo-charts").textContent);
  const plots = [];

  function drawCharts() {
    const plotly = typeof Plotly !== "undefined";
    document.getElementById("no-plotly").hidden = plotly;
    for (const div of document.querySelectorAll("div.plot")) {
      const stem = div.dataset.stem;
      if (!plotly) {
        const img = document.createElement("img");
        img.src = stem + ".png";
        img.alt = charts[stem].layout.title.text;
        div.appendChild(img);
        continue;
      }
      const chart = charts[stem];
      Plotly.newPlot(div, chart.data, chart.layout, {responsive: true, displaylogo: false});
      plots.push(div);
    }
  }

  // Ticked rows' configurations drawn wide, the others faded; none ticked: all as drawn.
  function highlight() {
    const chosen = new Set(Array.from(document.querySelectorAll("tr.chosen"), (tr) => tr.dataset.group));
    for (const div of plots) {
      const lines = [], others = [];
      div.data.forEach((trace, i) => {
        if (trace.legendgroup !== undefined) (trace.mode === "lines" ? lines : others).push(i);
      });
      const opacity = (i) => (chosen.size === 0 || chosen.has(div.data[i].legendgroup) ? 1 : 0.2);
      const width = (i) => (chosen.has(div.data[i].legendgroup) ? 4 : 2);
      if (lines.length) Plotly.restyle(div, {"opacity": lines.map(opacity), "line.width": lines.map(width)}, lines);
      if (others.length) Plotly.restyle(div, {"opacity": others.map(opacity)}, others);
    }
  }

  // A cell's sort key: its number (data-v) or its text; empty cells sort last either way.
  function sortTable(table, th) {
    const column = th.cellIndex;
    const order = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
    for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
    th.setAttribute("aria-sort", order);
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    const cells = rows.map((row) => row.cells[column]);
    const numeric = cells.every((c) => c.dataset.v !== undefined || c.textContent.trim() === "");
    const key = (row) => {
      const c = row.cells[column];
      return c.textContent.trim() === "" ? null : numeric ? Number(c.dataset.v) : c.textContent.trim();
    };
    const sign = order === "ascending" ? 1 : -1;
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      if (x === null || y === null) return (x === null) - (y === null);
      return sign * (numeric ? x - y : x.localeCompare(y, undefined, {numeric: true}));
    });
    body.append(...rows);
  }

  function filterTable(table, text) {
    const words = text.toLowerCase().split(/\s+/).filter(Boolean);
    for (const row of table.tBodies[0].rows) {
      const cells = row.textContent.toLowerCase();
      row.hidden = !words.every((w) => cells.includes(w));
    }
  }

  drawCharts();
  for (const table of document.querySelectorAll("table.sortable")) {
    for (const th of table.tHead.rows[0].cells) {
      if (!th.classList.contains("pick")) th.addEventListener("click", () => sortTable(table, th));
    }
  }
  for (const input of document.querySelectorAll("input.filter")) {
    const table = document.getElementById(input.dataset.table);
    input.addEventListener("input", () => filterTable(table, input.value));
  }
  for (const row of document.querySelectorAll("tr[data-group]")) {
    const box = row.querySelector("input[type=checkbox]");
    box.addEventListener("change", () => {
      row.classList.toggle("chosen", box.checked);
      highlight();
    });
    row.addEventListener("click", (event) => {
      if (event.target !== box) {
        box.checked = !box.checked;
        box.dispatchEvent(new Event("change"));
      }
    });
  }
})();
