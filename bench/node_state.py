#!/usr/bin/env python3
"""One line per node of resource r0 (role, disk, peers); exit 0 when every peer link is
Connected/Established, every replica UpToDate (a diskless node's Diskless) and nothing is
out of sync. Used by the bench scripts to wait for a pair or a cluster.

usage: node_state.py TANDEM_BIN DIR [--diskless NAME] NODE...   (DIR holds NODE.ctl)
"""
import json
import subprocess
import sys


def main(argv):
    tbin, d, rest = argv[1], argv[2], argv[3:]
    diskless = None
    if rest[:1] == ["--diskless"]:
        diskless, rest = rest[1], rest[2:]
    ok = True
    for n in rest:
        try:
            out = subprocess.run([tbin, "status", "--json", "--control", f"{d}/{n}.ctl"],
                                 capture_output=True, text=True, timeout=5)
            res = [r for r in json.loads(out.stdout) if r["name"] == "r0"][0]
        except Exception as e:  # not up yet
            print(f"{n}: no status ({type(e).__name__})")
            ok = False
            continue
        disks = [v["disk"] for v in res["volumes"]]
        want = "Diskless" if n == diskless else "UpToDate"
        ok &= all(x == want for x in disks)
        peers = []
        for p in res["peers"]:
            pw = "Diskless" if p["name"] == diskless else "UpToDate"
            vols = p["volumes"]
            ok &= p["connection"] == "Connected" and all(
                v["replication"] == "Established" and v["peer_disk"] == pw
                and v["out_of_sync_kib"] == 0 for v in vols)
            peers.append(f"{p['name']} {p['connection']}/"
                         + ",".join(f"{v['peer_disk']}/{v['replication']}"
                                    f"/oos {v['out_of_sync_kib']} KiB" for v in vols)
                         + (f" (last error: {p['last_error']})" if p.get("last_error") else ""))
        print(f"{n}: {res['role']}, disk {','.join(disks)}; peers: " + "; ".join(peers))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
