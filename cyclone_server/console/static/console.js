// Cyclone console: live updates of the run page. While the run is not terminal, its parts
// (header, graph, steps, timeline, input/result) are fetched again every second from
// /runs/ID/live, rendered and escaped by the server, and swapped in. No library, no build.
(function () {
  "use strict";
  var run = document.getElementById("run");
  if (!run || run.dataset.terminal === "true") return;
  var url = run.dataset.liveUrl;
  var every = Math.max(250, parseInt(run.dataset.pollMs || "1000", 10));
  var names = ["summary", "actions", "graph", "steps", "timeline", "io"];
  var openDetails = function () {
    var open = {};
    run.querySelectorAll("details[open]").forEach(function (d) {
      var row = d.closest("[data-node]");
      open[(row ? row.dataset.node : "") + "|" + d.className + "|" + d.querySelector("summary").textContent] = true;
    });
    return open;
  };
  var reopen = function (open) {
    run.querySelectorAll("details").forEach(function (d) {
      var row = d.closest("[data-node]");
      if (open[(row ? row.dataset.node : "") + "|" + d.className + "|" + d.querySelector("summary").textContent]) d.open = true;
    });
  };
  var tick = function () {
    if (document.hidden) { setTimeout(tick, every); return; }  // a background tab asks nothing
    fetch(url, {credentials: "same-origin", cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (r) {
        if (r.status === 404) { run.dataset.gone = "true"; throw new Error("gone"); }  // purged: stop
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(function (data) {
        var open = openDetails();
        names.forEach(function (n) {
          var el = document.getElementById("part-" + n);
          if (el && data.parts[n] !== undefined && el.innerHTML !== data.parts[n]) el.innerHTML = data.parts[n];
        });
        reopen(open);
        run.dataset.state = data.state;
        if (data.terminal) { run.dataset.terminal = "true"; return; }
        setTimeout(tick, every);
      })
      .catch(function () { if (run.dataset.gone !== "true") setTimeout(tick, every * 3); });
  };
  setTimeout(tick, every);
})();

// Tables marked data-refresh="true" (the runs page's first page, the backlog) fetch the page
// again every 2 seconds and swap in their new rows; an older page of runs stays as it is.
(function () {
  "use strict";
  var tables = document.querySelectorAll('table[data-refresh="true"][id]');
  if (!tables.length) return;
  var tick = function () {
    if (document.hidden) { setTimeout(tick, 2000); return; }
    fetch(location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        var doc = new DOMParser().parseFromString(html, "text/html");
        tables.forEach(function (table) {
          var fresh = doc.getElementById(table.id);
          var body = table.querySelector("tbody"), freshBody = fresh && fresh.querySelector("tbody");
          if (body && freshBody && body.innerHTML !== freshBody.innerHTML) body.innerHTML = freshBody.innerHTML;
        });
        setTimeout(tick, 2000);
      })
      .catch(function () { setTimeout(tick, 6000); });
  };
  setTimeout(tick, 2000);
})();
