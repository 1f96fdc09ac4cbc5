// The agent-mail console's own script (no inline script: the Content-Security-Policy allows this file only).
// Live pages: one server-sent event stream (/ui/events), woken by the server's waits; on a change the page fetches
// its own URL again and swaps the live part (<main id="live">) in, so nothing typed in a form is lost. A session
// that ended (token revoked, expired) sends the page to the login form.
(function () {
  "use strict";
  var state = document.getElementById("live-state");
  function say(text) { if (state) { state.textContent = text; } }

  function refresh() {
    return fetch(location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}, cache: "no-store"})
      .then(function (response) {
        if (response.redirected && response.url.indexOf("/ui/login") !== -1) {
          location.assign(response.url);
          return null;
        }
        return response.text();
      })
      .then(function (text) {
        if (text === null) { return; }
        var fresh = new DOMParser().parseFromString(text, "text/html").getElementById("live");
        var here = document.getElementById("live");
        if (fresh && here) {
          here.replaceChildren.apply(here, Array.prototype.slice.call(fresh.childNodes));
          document.body.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { say("offline"); });
  }

  function listen() {
    if (!window.EventSource) { return; }
    var source = new EventSource("/ui/events");
    var busy = false, again = false;
    function changed() {
      if (busy) { again = true; return; }
      busy = true;
      refresh().then(function () {
        busy = false;
        if (again) { again = false; changed(); }
      });
    }
    source.addEventListener("ready", function () { say("live"); document.body.setAttribute("data-live-ready", "yes"); });
    source.addEventListener("change", changed);
    source.addEventListener("ended", function () { source.close(); location.reload(); });
    source.addEventListener("unlive", function () { source.close(); say("not live: reload to update"); });
    source.addEventListener("stopping", function () { say("server restarting"); });
    source.onerror = function () { say("reconnecting"); };
    source.onopen = function () { say("live"); };
  }

  document.addEventListener("DOMContentLoaded", function () {
    if (document.body.getAttribute("data-live") === "yes") { listen(); }
  });
})();
