"""The HTML report's inline stylesheet and its one script (click a column header to sort). Constants
only: the script reads no data from the page except the cells' own text and `data-v` values."""

from __future__ import annotations

CSS = """
:root{--fg:#1f2328;--dim:#656d76;--line:#d8dee4;--bg:#fff;--panel:#f6f8fa}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.5 system-ui,-apple-system,"Segoe UI",sans-serif}
main{max-width:1000px;margin:0 auto;padding:20px 24px 40px}
header h1{font-size:20px;margin:0}
header .file{color:#0969da}
.meta{margin:2px 0;color:var(--dim)}
.path{margin:0;color:var(--dim);font-size:12px;word-break:break-all}
.bound{font-size:17px;font-weight:600;margin:14px 0 0;padding:10px 14px;background:var(--panel);
  border-left:4px solid #0969da;border-radius:4px}
.ok{color:#1a7f37;font-weight:600}
.finding{border:1px solid var(--line);border-radius:6px;margin:8px 0;padding:0 14px;background:#fff}
.finding[open]{padding-bottom:10px}
.finding.sev-critical{border-left:5px solid #cf222e}
.finding.sev-major{border-left:5px solid #d4760a}
.finding.sev-minor{border-left:5px solid #bf8700}
.finding.sev-info{border-left:5px solid #8c959f}
.finding summary{cursor:pointer;padding:9px 0;display:flex;gap:10px;align-items:baseline;flex-wrap:wrap}
.badge{font-size:11px;font-weight:700;text-transform:uppercase;padding:1px 7px;border-radius:10px;color:#fff}
.badge.critical{background:#cf222e}.badge.major{background:#d4760a}
.badge.minor{background:#bf8700}.badge.info{background:#8c959f}
.finding .title{font-weight:600;font-size:15px}
.saving{color:#1a7f37;font-weight:600}
.fid{color:var(--dim);font-size:12px;margin-left:auto;font-family:ui-monospace,monospace}
.evidence{margin:0 0 6px;padding-left:20px}
.label{margin:4px 0 0;color:var(--dim);font-size:12px}
.sources{margin:0;padding-left:20px}
.fix{margin:6px 0}
pre{background:#0d1117;color:#e6edf3;padding:10px 12px;border-radius:6px;overflow-x:auto;font-size:12.5px;
  line-height:1.45;margin:6px 0 0}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:10px 0 14px}
.tile{flex:1 1 120px;border:1px solid var(--line);border-radius:6px;padding:6px 12px;background:#fff}
.tile b{display:block;font-size:18px}
.tile span{color:var(--dim);font-size:12px}
section h2{font-size:16px;border-bottom:1px solid var(--line);padding-bottom:4px;margin:26px 0 8px}
.note,.na{color:var(--dim);margin:4px 0}
.scroll{overflow-x:auto}
.chart{display:block;max-width:100%;height:auto}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:var(--dim);margin:4px 0 0 64px}
.key i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;vertical-align:-1px}
table{border-collapse:collapse;width:100%;font-size:13px;margin:6px 0 12px;table-layout:auto}
th,td{padding:4px 8px;border-bottom:1px solid #eaeef2;text-align:left}
thead th{background:var(--panel);font-weight:600;white-space:nowrap}
table.sortable thead th{cursor:pointer;user-select:none}
table.sortable thead th:after{content:" \\2195";color:#afb8c1;font-size:11px}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.name{font-family:ui-monospace,monospace;font-size:12px;max-width:300px;overflow:hidden;
  text-overflow:ellipsis;white-space:nowrap}
.verdict{margin:6px 0;font-weight:600}
table.ranks tr.straggler td{background:#fff0ee}
table.ranks tr.slowest td{background:#fffbe6}
table.ranks tr[aria-current] td:first-child{box-shadow:inset 3px 0 #0969da}
table.ranks{font-size:12.5px}
table.ranks th,table.ranks td{padding:4px 5px}
table.ranks thead th{white-space:normal;vertical-align:bottom}
table.ranks td:first-child{white-space:nowrap}
table.ranks td.top{font-family:ui-monospace,monospace;font-size:12px;overflow-wrap:break-word}
table.ranks td.name{max-width:160px}
table.ranks .badge{margin-left:4px;font-size:10px;padding:1px 5px}
a.tile{color:inherit;text-decoration:none}
table.kv th{width:220px;background:none;font-weight:500;color:var(--dim)}
footer{margin-top:30px;color:var(--dim);font-size:12px}
"""

# Sorts a table's body by the clicked column: numerically by data-v where the cells carry it.
SORT_JS = """
document.querySelectorAll("table.sortable").forEach(function (table) {
  table.querySelectorAll("thead th").forEach(function (th, col) {
    th.addEventListener("click", function () {
      var body = table.tBodies[0], rows = Array.prototype.slice.call(body.rows);
      var asc = th.getAttribute("data-dir") !== "asc";
      table.querySelectorAll("thead th").forEach(function (o) { o.removeAttribute("data-dir"); });
      th.setAttribute("data-dir", asc ? "asc" : "desc");
      function key(row) {
        var cell = row.cells[col], v = cell.getAttribute("data-v");
        return v === null ? cell.textContent : (v === "" ? -Infinity : parseFloat(v));
      }
      rows.sort(function (a, b) {
        var x = key(a), y = key(b), c = x < y ? -1 : x > y ? 1 : 0;
        return asc ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
});
"""
