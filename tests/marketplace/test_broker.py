"""The embedded broker publishes atomically: a consumer never sees a half-written message."""

from __future__ import annotations

import os
import threading

from kombu import Connection

from marketplace.server.broker import Transport


def test_messages_appear_whole_under_their_final_name(tmp_path) -> None:
    folder = str(tmp_path)
    options = {"data_folder_in": folder, "data_folder_out": folder, "store_processed": False,
               "control_folder": str(tmp_path / "control")}  # fmt: skip
    seen_partial: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # what kombu's consumer does: list, then read *.msg files
        while not stop.is_set():
            for name in os.listdir(folder):
                if name.endswith(".msg"):
                    try:
                        with open(os.path.join(folder, name), "rb") as f:
                            if not f.read():
                                seen_partial.append(name)
                    except FileNotFoundError:
                        pass

    watcher = threading.Thread(target=watch)
    watcher.start()
    with Connection(transport=Transport, transport_options=options) as conn:
        queue = conn.SimpleQueue("q")
        big = "x" * 200_000
        for i in range(200):
            queue.put({"i": i, "pad": big})
        got = [queue.get(timeout=5).payload["i"] for _ in range(200)]
        queue.close()
    stop.set()
    watcher.join()
    assert sorted(got) == list(range(200))
    assert seen_partial == []
    assert not [n for n in os.listdir(folder) if n.endswith(".tmp")]
