"""The two-node bed itself: both agents answer, the link, the SAN and the shared folder."""

from __future__ import annotations

from tests.harness.twonode import Cluster


def test_nodes_answer_and_see_each_other(cluster: Cluster) -> None:
    names = {cluster.a.call("ping")["node"], cluster.b.call("ping")["node"]}
    assert names == {"nodea", "nodeb"}
    # The private link carries TCP between the guests (what migration uses).
    server = cluster.b.call("spawn", name="nc", log=str(cluster.b.dir / "nc.log"),
                            argv=["python3", "-c",
                                  "import socket;s=socket.create_server(('0.0.0.0',4499));"
                                  "c,_=s.accept();c.sendall(c.recv(64)[::-1])"])
    assert server["pid"] > 0
    # The client tries again until the server listens.
    out = cluster.a.sh("python3", "-c",
                       "import socket,time\n"
                       "for _ in range(50):\n"
                       "  try: c=socket.create_connection(('10.99.0.2',4499),timeout=5); break\n"
                       "  except OSError: time.sleep(0.2)\n"
                       "c.sendall(b'hello'); print(c.recv(64).decode())")
    assert out.strip() == "olleh"
    cluster.b.call("stop", name="nc")


def test_both_nodes_see_the_shared_vg(cluster: Cluster) -> None:
    lv = "bedcheck"
    cluster.a.sh("lvcreate", "-q", "-y", "-L", "8m", "-n", lv, cluster.vg)
    try:
        path = f"/dev/{cluster.vg}/{lv}"
        cluster.a.sh("dd", "if=/dev/zero", f"of={path}", "bs=4k", "count=1", "oflag=direct")
        cluster.a.sh("sh", "-c", f"printf SANCHECK | dd of={path} oflag=direct,sync conv=notrunc"
                     " bs=512 count=1 2>/dev/null")
        cluster.b.sh("lvchange", "-ay", f"{cluster.vg}/{lv}")
        seen = cluster.b.sh("dd", f"if={path}", "bs=512", "count=1", "iflag=direct")
        assert seen.startswith("SANCHECK")
        cluster.b.sh("lvchange", "-an", f"{cluster.vg}/{lv}")
    finally:
        cluster.a.sh("lvremove", "-q", "-f", f"{cluster.vg}/{lv}")


def test_shared_folder_is_seen_at_once(cluster: Cluster) -> None:
    probe = cluster.pve / "probe"
    cluster.a.sh("mkdir", str(probe))
    assert cluster.b.run(["mkdir", str(probe)], check=False).rc != 0  # atomic across guests
    cluster.b.sh("rmdir", str(probe))
