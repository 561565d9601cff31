#!/usr/bin/env python3
"""Drive the `ambit dashboard` page in headless Chromium and check what it draws.

    drive.py --url http://127.0.0.1:PORT/ --expect EXPECT.json --screenshot OUT.png [--report REPORT.json]

Needs Python 3, selenium 4 (developed with selenium==4.51.0 from PyPI, in a venv:
`python3 -m venv /opt/ambit-selenium && /opt/ambit-selenium/bin/pip install selenium==4.51.0`)
and Debian's `chromium` + `chromium-driver` (/usr/bin/chromedriver; selenium is
told not to download anything).

EXPECT.json (every key optional):
  nodes            [node id]               each drawn, as <g class="node" data-id=...>
  kinds            {node id: kind}         its data-kind
  mtlsEdges        [edge id]               data-mtls="all" and a .lock
  plaintextEdges   [edge id]               data-mtls="none"
  nodePanels       [{id, contains}]        clicking the node opens #details with every string of
                                           `contains` in its text
  deniedEdges      [{id, count, policy}]   class denied, .denied-count showing exactly `count`;
                                           clicking the first one shows `policy` in #details .policy-name
  live             {command, node, policies, then, edge, denied, within}
                                           run `command`; wait `within` s for `node` to show
                                           data-policies == `policies` (when given); run each of
                                           `then`; wait `within` s for `edge` (with data-denied ==
                                           `denied` when given); all without a reload
  maxFirstRenderMs number
In the live commands, "{url}" is replaced by --url without its trailing slash.

Exits 1 with one line per failed check; prints a one-line summary when all pass.
"""
import argparse
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("SE_OFFLINE", "true")  # never let selenium manager download a driver

from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import TimeoutException, WebDriverException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = os.environ.get("AMBIT_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("AMBIT_CHROMEDRIVER", "/usr/bin/chromedriver")

# Everything the checks need, read in one round trip.
SNAPSHOT_JS = """
const out = {nodes: {}, edges: {}, refreshes: document.body.dataset.refreshes || null,
             noReload: window.__ambitNoReload === 1, firstRenderMs: window.ambitFirstRenderMs,
             rendered: document.querySelector('#graph') && document.querySelector('#graph').getAttribute('data-rendered')};
for (const g of document.querySelectorAll('#graph g.node')) out.nodes[g.getAttribute('data-id')] = g.getAttribute('data-kind');
for (const g of document.querySelectorAll('#graph g.edge')) {
  const dc = g.querySelector('.denied-count');
  out.edges[g.getAttribute('data-id')] = {denied: g.getAttribute('data-denied'), mtls: g.getAttribute('data-mtls'),
    deniedClass: g.classList.contains('denied'), lock: !!g.querySelector('.lock'),
    deniedCount: dc ? dc.textContent : null};
}
return out;
"""

GRAPH_RESOURCE_JS = """
const es = performance.getEntriesByType('resource').filter(e => new URL(e.name).pathname === '/api/graph');
const full = es.filter(e => e.encodedBodySize > 0);
const pick = e => e ? {transferSize: e.transferSize, encodedBodySize: e.encodedBodySize,
                       decodedBodySize: e.decodedBodySize, name: e.name} : null;
return {count: es.length, last: pick(es[es.length - 1]), lastFull: pick(full[full.length - 1])};
"""


class Failures:
    def __init__(self):
        self.items = []

    def add(self, msg):
        self.items.append(msg)
        print("FAIL: " + msg, file=sys.stderr, flush=True)


def die(msg, driver=None, shot=None):
    print("FAIL: " + msg, file=sys.stderr, flush=True)
    if driver is not None and shot:
        try:
            driver.save_screenshot(shot)
            print("screenshot of the failure: " + shot, file=sys.stderr)
        except WebDriverException:
            pass
    if driver is not None:
        driver.quit()
    sys.exit(1)


def start_browser():
    opts = webdriver.ChromeOptions()
    if os.path.exists(CHROMIUM):
        opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000",
              "--disable-gpu", "--no-first-run", "--disable-extensions", "--hide-scrollbars",
              "--force-device-scale-factor=1"):
        opts.add_argument(a)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    if not os.path.exists(CHROMEDRIVER):
        die("no chromedriver at %s (apt-get install chromium-driver, or set AMBIT_CHROMEDRIVER)" % CHROMEDRIVER)
    try:
        return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    except WebDriverException as e:
        die("cannot start chromium through %s: %s" % (CHROMEDRIVER, str(e).strip().splitlines()[0]))


def run(cmd, url):
    cmd = [str(c).replace("{url}", url.rstrip("/")) for c in cmd]
    try:
        r = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)
    except subprocess.CalledProcessError as e:
        return "command %s exited with %s\nstdout:\n%s\nstderr:\n%s" % (cmd, e.returncode, e.stdout, e.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "command %s did not run: %s" % (cmd, e)
    if r.stdout.strip():
        print("  %s: %s" % (os.path.basename(cmd[0]), r.stdout.strip().splitlines()[-1]))
    return None


def main():
    ap = argparse.ArgumentParser(description="Drive the ambit dashboard in headless Chromium.")
    ap.add_argument("--url", required=True)
    ap.add_argument("--expect", required=True)
    ap.add_argument("--screenshot", required=True)
    ap.add_argument("--report")
    a = ap.parse_args()
    with open(a.expect) as f:
        exp = json.load(f)
    shot = a.screenshot
    root, ext = os.path.splitext(shot)
    shot_graph = root + "-graph" + (ext or ".png")
    fails = Failures()

    driver = start_browser()
    try:
        driver.get(a.url)
    except WebDriverException as e:
        die("cannot open %s: %s" % (a.url, str(e).strip().splitlines()[0]), driver)
    try:
        WebDriverWait(driver, 15, poll_frequency=0.05).until(
            lambda d: d.execute_script("const g = document.querySelector('#graph');"
                                       "return !!(g && g.hasAttribute('data-rendered'));"))
    except TimeoutException:
        problems = driver.execute_script("const p = document.querySelector('#problems'); return p ? p.textContent : null")
        die("the page did not render the graph within 15 s: #graph has no data-rendered attribute"
            + (" (the page says: %s)" % problems if problems else ""), driver, shot)

    snap = driver.execute_script(SNAPSHOT_JS)
    first_ms = snap["firstRenderMs"]
    if not isinstance(first_ms, (int, float)):
        fails.add("window.ambitFirstRenderMs is %r, expected a number" % (first_ms,))
    elif "maxFirstRenderMs" in exp and first_ms > exp["maxFirstRenderMs"]:
        fails.add("first render took %s ms, expected at most %s ms" % (first_ms, exp["maxFirstRenderMs"]))

    nodes, edges = snap["nodes"], snap["edges"]
    for nid in exp.get("nodes", []):
        if nid not in nodes:
            fails.add("node %s: not drawn (no g.node with that data-id; %d nodes drawn)" % (nid, len(nodes)))
    for nid, kind in exp.get("kinds", {}).items():
        if nid not in nodes:
            fails.add("node %s: not drawn, expected one of kind %s" % (nid, kind))
        elif nodes[nid] != kind:
            fails.add("node %s: data-kind is %r, expected %r" % (nid, nodes[nid], kind))

    def edge(eid):
        e = edges.get(eid)
        if e is None:
            fails.add("edge %s: not drawn (no g.edge with that data-id; %d edges drawn)" % (eid, len(edges)))
        return e

    for eid in exp.get("mtlsEdges", []):
        e = edge(eid)
        if e is None:
            continue
        if e["mtls"] != "all":
            fails.add('edge %s: data-mtls is "%s", expected "all"' % (eid, e["mtls"]))
        if not e["lock"]:
            fails.add("edge %s: has no .lock element, expected one (mTLS)" % eid)
    for eid in exp.get("plaintextEdges", []):
        e = edge(eid)
        if e is not None and e["mtls"] != "none":
            fails.add('edge %s: data-mtls is "%s", expected "none"' % (eid, e["mtls"]))
    for d in exp.get("deniedEdges", []):
        e = edge(d["id"])
        if e is None:
            continue
        if not e["deniedClass"]:
            fails.add("edge %s: has no class \"denied\", expected it (data-denied is %s)" % (d["id"], e["denied"]))
        if "count" in d:
            if e["denied"] != str(d["count"]):
                fails.add('edge %s: data-denied is "%s", expected "%s"' % (d["id"], e["denied"], d["count"]))
            if e["deniedCount"] is None:
                fails.add("edge %s: no .denied-count element, expected one showing %s" % (d["id"], d["count"]))
            else:
                import re
                shown = re.findall(r"\d+", e["deniedCount"])
                if not shown or int(shown[0]) != int(d["count"]):
                    fails.add('edge %s: .denied-count says "%s", expected it to show exactly %s'
                              % (d["id"], e["deniedCount"], d["count"]))

    driver.execute_script("window.__ambitNoReload = 1;")
    driver.save_screenshot(shot_graph)

    for want in exp.get("nodePanels", []):
        clicked = driver.execute_script("""
            const g = [...document.querySelectorAll('#graph g.node')].find(x => x.getAttribute('data-id') === arguments[0]);
            if (!g) return false;
            g.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
            return true;""", want["id"])
        if not clicked:
            fails.add("node %s: cannot click it, it is not drawn" % want["id"])
            continue
        text = [""]

        def panel_says(drv):
            text[0] = drv.execute_script("const p = document.querySelector('#details');"
                                         "return p && !p.hidden ? p.innerText : ''")
            return all(w in text[0] for w in want["contains"])
        try:
            WebDriverWait(driver, 5, poll_frequency=0.05).until(panel_says)
        except TimeoutException:
            missing = [w for w in want["contains"] if w not in text[0]]
            fails.add("node %s: its panel lacks %s; it says: %s"
                      % (want["id"], missing, text[0][:400].replace("\n", " | ")))

    denied = exp.get("deniedEdges", [])
    if denied:
        d = denied[0]
        clicked = driver.execute_script("""
            const g = [...document.querySelectorAll('#graph g.edge')].find(x => x.getAttribute('data-id') === arguments[0]);
            if (!g) return false;
            const p = g.querySelector('path.hit') || g.querySelector('path');
            p.dispatchEvent(new MouseEvent('click', {bubbles: true, cancelable: true, view: window}));
            return true;""", d["id"])
        if not clicked:
            fails.add("edge %s: cannot click it, it is not drawn" % d["id"])
        elif "policy" in d:
            seen = []

            def policy_shown(drv):
                seen[:] = drv.execute_script(
                    "return [...document.querySelectorAll('#details .policy-name')].map(e => e.textContent.trim())")
                return d["policy"] in seen
            try:
                WebDriverWait(driver, 5, poll_frequency=0.05).until(policy_shown)
            except TimeoutException:
                panel = driver.execute_script("const p = document.querySelector('#details');"
                                              "return p ? (p.hidden ? '(hidden)' : p.innerText.slice(0, 300)) : '(missing)'")
                fails.add("edge %s: after the click #details shows policy names %s, expected %r; the panel says: %s"
                          % (d["id"], seen, d["policy"], panel.replace("\n", " | ")))
            sel = driver.execute_script(
                "const g = [...document.querySelectorAll('#graph g.edge')].find(x => x.getAttribute('data-id') === arguments[0]);"
                "return !!(g && g.classList.contains('selected'))", d["id"])
            if not sel:
                fails.add("edge %s: not marked .selected after the click" % d["id"])
    time.sleep(0.3)  # let the panel's fonts and layout settle
    driver.save_screenshot(shot)

    live_seconds = None
    policy_seconds = None
    live = exp.get("live")
    if live:
        before = int(driver.execute_script("return document.body.dataset.refreshes || '0'"))
        t0 = time.time()
        within = float(live.get("within", 10))
        err = run(live["command"], a.url)
        if err:
            fails.add("live step: " + err)
        elif "node" in live:
            # The change itself (a policy applied) shows on the node it applies to.
            seen = [None]

            def live_node(drv):
                seen[0] = drv.execute_script(
                    "const g = [...document.querySelectorAll('#graph g.node')].find(x => x.getAttribute('data-id') === arguments[0]);"
                    "return g ? g.getAttribute('data-policies') : null", live["node"])
                return seen[0] == str(live["policies"])
            try:
                WebDriverWait(driver, within, poll_frequency=0.1).until(live_node)
                policy_seconds = round(time.time() - t0, 2)
            except TimeoutException:
                fails.add('live node %s: data-policies is "%s" %.0f s after the command, expected "%s"'
                          % (live["node"], seen[0], time.time() - t0, live["policies"]))
        for cmd in list(live.get("then", [])) if not err else []:
            err = run(cmd, a.url)
            if err:
                fails.add("live step: " + err)
                break
        if not err:
            want = live.get("denied")
            t1 = time.time()
            found = [None]

            def live_edge(drv):
                found[0] = drv.execute_script(
                    "const g = [...document.querySelectorAll('#graph g.edge')].find(x => x.getAttribute('data-id') === arguments[0]);"
                    "return g ? g.getAttribute('data-denied') : null", live["edge"])
                return found[0] is not None and (want is None or found[0] == str(want))
            try:
                WebDriverWait(driver, within, poll_frequency=0.1).until(live_edge)
                live_seconds = round(time.time() - t1, 2)
            except TimeoutException:
                if found[0] is None:
                    fails.add("live edge %s: not drawn %.0f s after the commands, expected it%s"
                              % (live["edge"], time.time() - t1, " with data-denied \"%s\"" % want if want is not None else ""))
                else:
                    fails.add('live edge %s: data-denied is "%s" %.0f s after the commands, expected "%s"'
                              % (live["edge"], found[0], time.time() - t1, want))
        after_snap = driver.execute_script(SNAPSHOT_JS)
        if not after_snap["noReload"]:
            fails.add("window.__ambitNoReload is gone: the page reloaded during the live step, expected in-place updates")
        after = int(after_snap["refreshes"] or 0)
        if after <= before:
            fails.add("document.body.dataset.refreshes is %s after the live step, expected more than %s" % (after, before))
        nodes, edges = after_snap["nodes"], after_snap["edges"]
        driver.save_screenshot(root + "-live" + (ext or ".png"))

    res = driver.execute_script(GRAPH_RESOURCE_JS)
    last = res["last"] or {}
    full = res["lastFull"] or {}
    refreshes = int(driver.execute_script("return document.body.dataset.refreshes || '0'"))
    logs = []
    try:
        logs = [m for m in driver.get_log("browser") if m.get("level") == "SEVERE"]
    except WebDriverException:
        pass
    for m in logs:
        fails.add("browser console error: %s" % m.get("message"))
    driver.quit()

    if not res["count"]:
        fails.add("no /api/graph request in performance.getEntriesByType('resource'), expected at least one")
    print("last /api/graph response: transferSize %s B, encodedBodySize %s B (last full body: transferSize %s B, "
          "body %s B, decoded %s B; %d graph requests seen)"
          % (last.get("transferSize"), last.get("encodedBodySize"), full.get("transferSize"),
             full.get("encodedBodySize"), full.get("decodedBodySize"), res["count"]))
    report = {"firstRenderMs": first_ms, "refreshBytes": last.get("transferSize"),
              "refreshBodyBytes": last.get("encodedBodySize"), "fullRefreshBytes": full.get("transferSize"),
              "liveSeconds": live_seconds, "policySeconds": policy_seconds, "nodes": len(nodes), "edges": len(edges), "refreshes": refreshes,
              "failures": fails.items, "screenshots": [shot_graph, shot]}
    if a.report:
        with open(a.report, "w") as f:
            json.dump(report, f, indent=2)
    if fails.items:
        print("ambit dashboard: %d check(s) failed (first: %s)" % (len(fails.items), fails.items[0]), file=sys.stderr)
        sys.exit(1)
    print("ambit dashboard OK: %d nodes, %d edges drawn; first render %s ms; last refresh %s B (full graph %s B); "
          "live edge after %s; %d refreshes"
          % (len(nodes), len(edges), first_ms, last.get("transferSize"), full.get("transferSize"),
             "%s s" % live_seconds if live_seconds is not None else "n/a", refreshes))


if __name__ == "__main__":
    main()
