#!/usr/bin/env python3
"""Serve the dashboard assets and answer the dashboard API from a JSON fixture.

For developing and checking the browser side of `ambit dashboard` without the
Rust server.  Standard library only.

    serve_fixture.py --fixture fixtures/demo.json [--port 8787] [--assets DIR]
                     [--mutate-every SECONDS] [--tick SECONDS] [--no-etag]

A fixture is {"graph": {...as /api/graph...},
              "nodes": {id: {...as /api/node...}},   # optional; missing ids are synthesized
              "edges": {id: {...as /api/edge...}},   # optional; missing ids are synthesized
              "mutations": [mutation, ...]}          # optional, applied in order

A mutation is {"addNodes": [node], "addEdges": [edge], "update": {id: {field: value}},
"removeNodes": [id], "removeEdges": [id], "problems": [..], "nodeDetails": {id: detail},
"edgeDetails": {id: detail}}.  `POST /_mutate` applies the next mutation of the
fixture (or the mutation in the request body, when there is one); `--mutate-every`
does the same on a timer.  `--tick` grows the counters of busy edges every few
seconds so the page sees changing numbers.

Sends the Content-Security-Policy the Rust server sends, and an ETag over the
graph without its `generated` field (answers 304 to a matching If-None-Match).
"""
import argparse
import copy
import datetime
import hashlib
import json
import os
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_ASSETS = os.path.normpath(os.path.join(HERE, "..", "..", "src", "dashboard", "assets"))
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8"}


def now_iso():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class State:
    def __init__(self, fixture, etag=True):
        self.lock = threading.Lock()
        self.graph = copy.deepcopy(fixture["graph"])
        self.node_details = dict(fixture.get("nodes", {}))
        self.edge_details = dict(fixture.get("edges", {}))
        self.mutations = list(fixture.get("mutations", []))
        self.etag_enabled = etag
        self.requests = 0

    def mutate(self, m=None):
        with self.lock:
            if m is None:
                if not self.mutations:
                    return False
                m = self.mutations.pop(0)
            g = self.graph
            gone = set(m.get("removeNodes", []))
            g["nodes"] = [n for n in g["nodes"] if n["id"] not in gone]
            gone_e = set(m.get("removeEdges", []))
            g["edges"] = [e for e in g["edges"] if e["id"] not in gone_e
                          and e["source"] not in gone and e["target"] not in gone]
            g["nodes"].extend(copy.deepcopy(m.get("addNodes", [])))
            g["edges"].extend(copy.deepcopy(m.get("addEdges", [])))
            for item in g["nodes"] + g["edges"]:
                item.update(m.get("update", {}).get(item["id"], {}))
            if "problems" in m:
                g["problems"] = m["problems"]
            self.node_details.update(m.get("nodeDetails", {}))
            self.edge_details.update(m.get("edgeDetails", {}))
            return True

    def tick(self):
        with self.lock:
            for e in self.graph["edges"]:
                if e.get("connectionsPerSecond", 0) > 0:
                    e["connections"] += max(1, round(e["connectionsPerSecond"] * 2))
                    e["bytes"] += round(e.get("bytesPerSecond", 0) * 2)
                if e.get("requestsPerSecond", 0) > 0:
                    e["requests"] += max(1, round(e["requestsPerSecond"] * 2))

    def graph_body(self):
        with self.lock:
            g = copy.deepcopy(self.graph)
        tag = hashlib.sha256(json.dumps(g, sort_keys=True).encode()).hexdigest()[:16]
        g["generated"] = now_iso()
        return json.dumps(g).encode(), '"%s"' % tag

    def node(self, nid):
        with self.lock:
            n = next((n for n in self.graph["nodes"] if n["id"] == nid), None)
            if n is None:
                return None
            if nid in self.node_details:
                return self.node_details[nid]
            return synth_node(n, self.graph)

    def edge(self, eid):
        with self.lock:
            e = next((e for e in self.graph["edges"] if e["id"] == eid), None)
            if e is None:
                return None
            if eid in self.edge_details:
                return self.edge_details[eid]
            return synth_edge(e)


def synth_node(n, graph):
    """Plausible details for a node the fixture has none for."""
    pods = []
    for i in range(n.get("pods", 0)):
        pods.append({"name": "%s-%d" % (n["name"], i), "node": "node%d" % (1 + (i + len(n["name"])) % 6),
                     "ip": "10.244.%d.%d" % ((i + len(n["name"])) % 6 + 1, 10 + i),
                     "phase": "Ready", "enrolled": "enabled" if n.get("enrolled") else "disabled"})
    certs = []
    if n.get("identity") and n["kind"] != "service":
        for node in sorted({p["node"] for p in pods}):
            certs.append({"node": node, "identity": n["identity"], "state": "Available",
                          "expires": (datetime.datetime.now(datetime.timezone.utc)
                                      + datetime.timedelta(hours=23, minutes=41)).strftime("%Y-%m-%dT%H:%M:%SZ")})
    policies = [{"kind": "AuthorizationPolicy", "namespace": n["namespace"], "name": "%s-policy-%d" % (n["name"], i),
                 "action": "ALLOW", "appliesTo": "the workloads in %s with app=%s" % (n["namespace"], n["name"]),
                 "enforcedBy": "node proxies", "rules": ["allow from namespace %s" % n["namespace"]], "warnings": []}
                for i in range(n.get("policies", 0))]
    workloads = []
    if n["kind"] == "service":
        workloads = [e["target"] for e in graph["edges"] if e["source"] == n["id"]]
    return {"id": n["id"], "kind": n["kind"], "namespace": n["namespace"], "name": n["name"],
            "identity": n.get("identity", ""), "waypoint": n.get("waypoint"), "pods": pods,
            "certificates": certs, "policies": policies, "denials": [],
            "services": [] if n["kind"] != "service" else
            [{"namespace": n["namespace"], "name": n["name"], "clusterIp": "10.96.0.%d" % (len(n["name"]) + 20),
              "ports": ["80→8080"]}],
            "workloads": workloads}


def synth_edge(e):
    conns = []
    for i in range(min(e.get("connections", 0), 5)):
        conns.append({"time": now_iso(), "reporter": "node%d" % (1 + i % 6), "direction": "inbound",
                      "sourceAddress": "10.244.1.%d:%d" % (10 + i, 40000 + i),
                      "destinationAddress": "10.244.2.%d:8080" % (10 + i), "service": "",
                      "identity": (e.get("identities") or [""])[0], "bytesSent": 100 + i, "bytesReceived": 300 + i,
                      "duration": "%dms" % (1 + i), "error": None})
    return {"id": e["id"], "source": e["source"], "target": e["target"], "connections": conns,
            "denials": [], "policies": [], "requests": []}


def make_handler(state, assets):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            if os.environ.get("SERVE_FIXTURE_LOG"):
                sys.stderr.write("%s\n" % (fmt % args))

        def send(self, code, body, ctype="application/json", extra=None):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-cache")
            for k, v in (extra or {}).items():
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def error(self, code, msg):
            self.send(code, json.dumps({"error": msg}).encode())

        def do_GET(self):
            u = urllib.parse.urlsplit(self.path)
            q = urllib.parse.parse_qs(u.query)
            if u.path == "/api/graph":
                state.requests += 1
                body, tag = state.graph_body()
                if not state.etag_enabled:
                    return self.send(200, body)
                if self.headers.get("If-None-Match") == tag:
                    self.send_response(304)
                    self.send_header("ETag", tag)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return self.send(200, body, extra={"ETag": tag})
            if u.path in ("/api/node", "/api/edge"):
                ident = q.get("id", [""])[0]
                if not ident:
                    return self.error(400, "missing id")
                what = "node" if u.path == "/api/node" else "edge"
                d = state.node(ident) if what == "node" else state.edge(ident)
                if d is None:
                    return self.error(404, "no %s %s" % (what, ident))
                return self.send(200, json.dumps(d).encode())
            name = {"/": "index.html", "/app.js": "app.js", "/app.css": "app.css"}.get(u.path)
            if name is None and u.path.endswith(".js") and "/" not in u.path[1:]:
                name = u.path[1:]
            if name is None or not os.path.exists(os.path.join(assets, name)):
                return self.error(404, "no such page %s" % u.path)
            with open(os.path.join(assets, name), "rb") as f:
                body = f.read()
            return self.send(200, body, TYPES[os.path.splitext(name)[1]])

        do_HEAD = do_GET

        def do_POST(self):
            u = urllib.parse.urlsplit(self.path)
            if u.path != "/_mutate":
                return self.error(404, "no such page %s" % u.path)
            n = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(n) if n else b""
            m = json.loads(raw) if raw.strip() else None
            if not state.mutate(m):
                return self.error(409, "no mutation left")
            return self.send(200, json.dumps({"ok": True, "edges": len(state.graph["edges"])}).encode())

    return Handler


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", required=True)
    ap.add_argument("--port", type=int, default=8787)
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--assets", default=DEFAULT_ASSETS)
    ap.add_argument("--mutate-every", type=float, default=0)
    ap.add_argument("--tick", type=float, default=0)
    ap.add_argument("--no-etag", action="store_true")
    a = ap.parse_args()
    with open(a.fixture) as f:
        state = State(json.load(f), etag=not a.no_etag)

    def timer(every, fn):
        def loop():
            while True:
                time.sleep(every)
                fn()
        threading.Thread(target=loop, daemon=True).start()

    if a.mutate_every > 0:
        timer(a.mutate_every, state.mutate)
    if a.tick > 0:
        timer(a.tick, state.tick)
    srv = ThreadingHTTPServer((a.bind, a.port), make_handler(state, a.assets))
    print("serving %s on http://%s:%d/" % (a.fixture, a.bind, srv.server_address[1]), flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
