"""The launcher: clear messages for a taken port, --share offline and bad options; the app builds its tabs."""

import socket

from demos import app


def test_a_port_in_use_is_a_clear_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert app.main(["--port", str(port)]) == 2
    assert f"port {port} on 127.0.0.1 is in use" in capsys.readouterr().err


def test_share_fails_fast_offline(capsys, monkeypatch, tmp_path):
    from gradio import tunneling

    monkeypatch.setattr(tunneling, "BINARY_PATH", str(tmp_path / "frpc"))
    assert app.main(["--share"]) == 2
    assert "--share needs Gradio's share-tunnel client" in capsys.readouterr().err


def test_port_out_of_range(capsys):
    assert app.main(["--port", "70000"]) == 2
    assert "--port must be in [0, 65535]" in capsys.readouterr().err


def test_the_app_has_a_tab_per_modality(tmp_path):
    import gradio as gr

    blocks = app.build_app(workdir=tmp_path)
    tabs = [b.label for b in blocks.blocks.values() if isinstance(b, gr.Tab)]
    assert tabs == ["Image", "Image II", "Speech", "Text", "Video"]
    api = {d.api_name for d in blocks.fns.values() if d.api_name}
    assert {"image", "image2", "speech", "text", "video_play", "video_ask"} <= api


def test_cli_demo_passes_its_options_to_the_app(capsys):
    from mmaccel.cli import main

    assert main(["demo", "--port", "-1"]) == 2
    assert "--port must be in" in capsys.readouterr().err
