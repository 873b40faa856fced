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
    fetch(url, {credentials: "same-origin", cache: "no-store", headers: {"Accept": "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
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
      .catch(function () { setTimeout(tick, every * 3); });
  };
  setTimeout(tick, every);
})();

// The runs page: its first page (newest runs) refreshes its table every 2 seconds, with the
// same filters; an older page stays as it is.
(function () {
  "use strict";
  var table = document.getElementById("runs");
  if (!table || table.dataset.refresh !== "true") return;
  var tick = function () {
    fetch(location.href, {credentials: "same-origin", cache: "no-store"})
      .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.text(); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("runs");
        var body = table.querySelector("tbody");
        if (fresh && body && body.innerHTML !== fresh.querySelector("tbody").innerHTML) {
          body.innerHTML = fresh.querySelector("tbody").innerHTML;
        }
        setTimeout(tick, 2000);
      })
      .catch(function () { setTimeout(tick, 6000); });
  };
  setTimeout(tick, 2000);
})();
