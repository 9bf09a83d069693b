import av
import numpy as np
import pytest
from PIL import Image

from sessions.artifacts import ArtifactError, write_mp4, write_task_artifact


def gradient_frames(n: int, h: int, w: int) -> np.ndarray:
    out = np.zeros((n, h, w, 3), np.uint8)
    for i in range(n):
        out[i, :, :, 0] = np.linspace(0, 255, w, dtype=np.uint8)[None, :]
        out[i, :, :, 1] = 20 * i
    return out


def test_t2v_writes_an_mp4_that_decodes_to_the_frame_count(tmp_path) -> None:
    frames = gradient_frames(9, 48, 64)
    art = write_task_artifact("t2v", frames, tmp_path / "artifacts", "job1", fps=8)
    assert art.media_type == "video/mp4" and art.num_frames == 9 and art.path.name == "job1.mp4"
    with av.open(str(art.path)) as container:
        decoded = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert container.streams.video[0].average_rate == 8
    assert len(decoded) == 9 and decoded[0].shape == (48, 64, 3)
    assert np.abs(decoded[4].astype(int) - frames[4]).mean() < 6  # lossy but close
    assert not list((tmp_path / "artifacts").glob(".*partial"))


def test_odd_sizes_are_padded_and_mpeg4_fallback_works(tmp_path) -> None:
    art = write_mp4(gradient_frames(3, 33, 45), tmp_path / "odd.mp4", fps=4, codec="mpeg4")
    with av.open(str(art.path)) as container:
        stream = container.streams.video[0]
        assert (stream.codec_context.name, stream.width, stream.height) == ("mpeg4", 46, 34)
        assert sum(1 for _ in container.decode(video=0)) == 3


def test_t2i_writes_a_png_of_the_first_frame(tmp_path) -> None:
    frames = gradient_frames(2, 16, 24)
    art = write_task_artifact("t2i", frames, tmp_path, "img", fps=1)
    assert art.media_type == "image/png"
    assert np.array_equal(np.asarray(Image.open(art.path)), frames[0])


def test_bad_inputs_are_typed_errors(tmp_path) -> None:
    with pytest.raises(ArtifactError, match="uint8"):
        write_mp4(np.zeros((2, 8, 8, 3), np.float32), tmp_path / "a.mp4", fps=8)
    with pytest.raises(ArtifactError, match="no frames"):
        write_mp4(np.zeros((0, 8, 8, 3), np.uint8), tmp_path / "a.mp4", fps=8)
    with pytest.raises(ArtifactError, match="unknown task"):
        write_task_artifact("t2a", gradient_frames(1, 8, 8), tmp_path, "x", fps=8)
