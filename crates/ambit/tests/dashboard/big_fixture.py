#!/usr/bin/env python3
"""Write a big dashboard fixture for the scale check: 200 pods on 6 nodes,
60 workloads in 6 namespaces (3 of them waypoints), a service for most of them,
~150 edges, a few denied ones, plaintext ones and two external addresses.
Deterministic (fixed seed).

    big_fixture.py OUT.json [--expect EXPECT.json]

serve_fixture.py synthesizes the node and edge details it needs.  With
--expect, also writes a drive.py expectation for it (nodes, a denied edge,
a live edge added by POST /_mutate, maxFirstRenderMs 2000).
"""
import argparse
import json
import random

SP = "spiffe://cluster.local/ns/%s/sa/%s"
TIERS = [("frontend", ["web", "mobile-gw", "admin", "static", "auth-ui", "search-ui", "gateway", "cdn-shim", "ab-test", "landing"]),
         ("shop", ["cart", "catalog", "checkout", "pricing", "promo", "reviews", "inventory", "recommend", "wishlist", "waypoint"]),
         ("payments", ["payments", "fraud", "ledger", "refunds", "invoices", "tax", "currency", "payouts", "waypoint", "risk"]),
         ("identity", ["accounts", "sessions", "tokens", "profiles", "mfa", "audit", "consent", "groups", "keys", "directory"]),
         ("data", ["postgres", "redis", "kafka", "search", "blob", "analytics", "etl", "warehouse", "cache", "waypoint"]),
         ("legacy", ["mainframe-gw", "soap", "ftp-bridge", "batch", "reports", "mailer", "fax", "printer", "ldap", "cron"])]
AMBIENT = {"frontend": True, "shop": True, "payments": True, "identity": True, "data": True, "legacy": False}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--expect")
    a = ap.parse_args()
    rnd = random.Random(7)
    nodes, edges, wl_by_tier, svc_of = [], [], [], {}
    pods_left = 200
    all_wl = [(t, ns, n) for t, (ns, names) in enumerate(TIERS) for n in names]
    for i, (tier, ns, name) in enumerate(all_wl):
        left = len(all_wl) - i
        pods = pods_left if left == 1 else max(1, min(pods_left - (left - 1), rnd.choice([1, 2, 2, 3, 3, 4, 5, 6])))
        pods_left -= pods
        enrolled = AMBIENT[ns]
        kind = "waypoint" if name == "waypoint" else "workload"
        wid = "workload/%s/%s" % (ns, name)
        nodes.append({"id": wid, "kind": kind, "namespace": ns, "name": name, "pods": pods,
                      "identity": SP % (ns, name) if enrolled else "", "enrolled": enrolled,
                      "policies": rnd.choice([0, 0, 0, 1, 2]), "denied": 0, "waypoint": None})
        while len(wl_by_tier) <= tier:
            wl_by_tier.append([])
        wl_by_tier[tier].append(wid)
        if kind == "workload" and rnd.random() < 0.7:
            sid = "service/%s/%s" % (ns, name)
            wp = "%s/waypoint" % ns if ns in ("shop", "payments", "data") and rnd.random() < 0.5 else None
            nodes.append({"id": sid, "kind": "service", "namespace": ns, "name": name, "pods": pods, "identity": "",
                          "enrolled": enrolled, "policies": rnd.choice([0, 1]), "denied": 0, "waypoint": wp})
            svc_of[wid] = sid
    for ext in ("203.0.113.7", "unknown"):
        nodes.append({"id": "external/" + ext, "kind": "external", "namespace": "", "name": ext, "pods": 0,
                      "identity": "", "enrolled": False, "policies": 0, "denied": 0, "waypoint": None})
    byid = {n["id"]: n for n in nodes}

    def add(src, dst, denied=0):
        eid = src + "->" + dst
        if src == dst or any(e["id"] == eid for e in edges):
            return None
        s, t = byid[src], byid[dst]
        plain = not s.get("enrolled") or not t.get("enrolled") or t["kind"] == "external"
        cps = round(rnd.choice([0.01, 0.05, 0.2, 0.5, 1, 2, 5, 20, 80]), 2)
        http = t.get("waypoint") is not None
        e = {"id": eid, "source": src, "target": dst, "connections": int(cps * 600) + 1, "connectionsPerSecond": cps,
             "bytes": int(cps * 600 * 900), "bytesPerSecond": round(cps * 900, 1),
             "requests": int(cps * 6000) if http else 0, "requestsPerSecond": round(cps * 10, 2) if http else 0,
             "errors": rnd.choice([0, 0, 0, 2]) if http else 0, "denied": denied,
             "mtls": "none" if plain else rnd.choice(["all"] * 12 + ["some"]),
             "identities": [] if plain else [s["identity"] or SP % (s["namespace"], s["name"])]}
        edges.append(e)
        if denied:
            t["denied"] += denied
        return e

    # each service reaches its workload (through its waypoint when it has one)
    for wid, sid in sorted(svc_of.items()):
        wp = byid[sid]["waypoint"]
        if wp:
            add(sid, "workload/" + wp)
            add("workload/" + wp, wid)
        else:
            add(sid, wid)
    # calls from a tier to the tiers below it (mostly to services)
    callers = [w for t in wl_by_tier for w in t if byid[w]["kind"] == "workload"]
    targets_by_tier = [[svc_of.get(w, w) for w in t if byid[w]["kind"] == "workload"] for t in wl_by_tier]
    while len(edges) < 150:
        src = rnd.choice(callers)
        tier = next(i for i, t in enumerate(wl_by_tier) if src in t)
        lo = min(tier + 1, len(TIERS) - 1) if rnd.random() < 0.8 else tier
        dt = rnd.randint(lo, len(TIERS) - 1)
        dst = rnd.choice(targets_by_tier[dt])
        denied = rnd.choice([1, 2, 4]) if rnd.random() < 0.06 else 0
        add(src, dst, denied)
    add("workload/legacy/mailer", "external/203.0.113.7")
    add("workload/payments/payouts", "external/unknown")
    add("workload/data/etl", "workload/frontend/web")           # a cycle back up
    first_denied = next((e for e in edges if e["denied"] > 0), None)
    if first_denied is None:
        first_denied = add("workload/legacy/batch", "service/payments/payments" if "workload/payments/payments" in svc_of
                           else "workload/payments/payments", 3)
    graph = {"generated": "2026-12-07T07:30:00Z", "source": "big fixture (big_fixture.py)", "interval": 2,
             "problems": [], "namespaces": [{"name": ns, "ambient": AMBIENT[ns]} for ns, _ in TIERS],
             "nodes": nodes, "edges": edges}
    live_edge = {"id": "workload/legacy/cron->workload/payments/ledger", "source": "workload/legacy/cron",
                 "target": "workload/payments/ledger", "connections": 2, "connectionsPerSecond": 0.05, "bytes": 0,
                 "bytesPerSecond": 0, "requests": 0, "requestsPerSecond": 0, "errors": 0, "denied": 2, "mtls": "none",
                 "identities": []}
    pol = {"kind": "AuthorizationPolicy", "namespace": first_denied["target"].split("/")[1], "name": "deny-strangers",
           "action": "DENY", "appliesTo": "everything in the namespace", "enforcedBy": "node proxies",
           "rules": ["deny from namespace legacy"], "warnings": []}
    fixture = {"graph": graph, "mutations": [{"addEdges": [live_edge]}],
               "edges": {first_denied["id"]: {"id": first_denied["id"], "source": first_denied["source"],
                                              "target": first_denied["target"], "connections": [],
                                              "denials": [{"time": "2026-12-07T07:29:00Z", "node": "node3",
                                                           "source": "", "sourceAddress": "10.244.3.9:40001",
                                                           "destination": first_denied["target"],
                                                           "reason": "a deny policy matched",
                                                           "policies": [pol["namespace"] + "/deny-strangers"]}],
                                              "policies": [pol], "requests": []}}}
    with open(a.out, "w") as f:
        json.dump(fixture, f, indent=1)
    pods = sum(n["pods"] for n in nodes if n["kind"] in ("workload", "waypoint"))
    print("wrote %s: %d nodes (%d workloads, %d pods), %d edges" % (
        a.out, len(nodes), sum(1 for n in nodes if n["kind"] in ("workload", "waypoint")), pods, len(edges)))
    if a.expect:
        exp = {"nodes": [n["id"] for n in nodes],
               "deniedEdges": [{"id": first_denied["id"], "count": first_denied["denied"],
                                "policy": pol["namespace"] + "/deny-strangers"}],
               "live": {"command": ["curl", "-sSf", "-X", "POST", "{url}/_mutate"], "then": [],
                        "edge": live_edge["id"], "denied": 2, "within": 10},
               "maxFirstRenderMs": 2000}
        with open(a.expect, "w") as f:
            json.dump(exp, f, indent=1)


if __name__ == "__main__":
    main()
