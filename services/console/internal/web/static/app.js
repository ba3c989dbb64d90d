// Floodgate console: polls for new alerts and prepends them to the list.
"use strict";
(function () {
  var live = document.getElementById("live");
  var rows = document.getElementById("alert-rows");
  if (!live || !rows || !live.dataset.poll) return;
  var after = live.dataset.after;
  var interval = parseInt(live.dataset.interval, 10) || 5000;
  var failures = 0;
  function poll() {
    var url = live.dataset.poll + (live.dataset.poll.indexOf("?") >= 0 ? "&" : "?") + "after=" + encodeURIComponent(after);
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (res) {
        if (res.status === 401) { live.textContent = "Your session ended; reload to sign in again."; return null; }
        if (!res.ok) throw new Error("HTTP " + res.status);
        var latest = res.headers.get("X-Latest");
        var count = parseInt(res.headers.get("X-New-Count") || "0", 10);
        return res.text().then(function (html) { return { html: html, latest: latest, count: count }; });
      })
      .then(function (r) {
        if (!r) return;
        failures = 0;
        if (r.count > 0) {
          var tmp = document.createElement("tbody");
          tmp.innerHTML = r.html;
          var fresh = Array.prototype.filter.call(tmp.querySelectorAll("tr"), function (tr) {
            return !rows.querySelector('tr[data-id="' + CSS.escape(tr.dataset.id) + '"]');
          });
          for (var i = fresh.length - 1; i >= 0; i--) {
            fresh[i].classList.add("fresh");
            rows.insertBefore(fresh[i], rows.firstChild);
          }
          var empty = document.getElementById("empty");
          if (empty && fresh.length) empty.remove();
          if (fresh.length) live.textContent = fresh.length + (fresh.length === 1 ? " new alert" : " new alerts") + " at " + new Date().toLocaleTimeString() + ".";
        }
        if (r.latest) after = r.latest;
        setTimeout(poll, interval);
      })
      .catch(function () {
        failures++;
        live.textContent = "Could not check for new alerts; retrying.";
        setTimeout(poll, Math.min(interval * Math.pow(2, failures), 60000));
      });
  }
  setTimeout(poll, interval);
})();
