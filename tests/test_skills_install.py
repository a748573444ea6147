"""Skill installs and removals from a real local HTTP server into a real skills folder.

Every refused install must leave the folder byte-for-byte as it was (no staging left over).
"""

from __future__ import annotations

import gzip
import io
import os
import re
import stat
import zipfile
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx2
import pytest

from ania_nb.errors import ToolError
from ania_nb.skills import SkillInstaller, SkillInstallError, SkillManager, skill_tools
from ania_nb.skills.install import _swap_in
from ania_nb.store import Store
from ania_nb.testing._http import Answer, RoutedServer
from ania_nb.tools import ToolContext

# The test server runs on 127.0.0.1, which downloads refuse unless the operator allows it.
LOCAL = ["127.0.0.1"]
GOOD_MD = "---\nname: {name}\ndescription: {desc}\nlicense: MIT\n---\n# {name}\nSteps.\n"


# --- a real HTTP server on 127.0.0.1 ----------------------------------------------------------


class Server(RoutedServer):
    """The loopback server ScriptedLLM is built on, serving files like a download host."""

    def serve(
        self,
        path: str,
        body: bytes,
        *,
        status: int = 200,
        content_length: bool = True,  # False: no length header, the body ends at the close
        stall: bool = False,  # send headers, then hang until the test ends
        headers: dict[str, str] | None = None,  # e.g. Content-Encoding
    ) -> str:
        options = {"headers": headers or {}, "length": content_length, "stall": stall}
        return self.route(path, Answer(status, body, "application/octet-stream", **options))

    @property
    def paths(self) -> list[str]:
        return [seen.raw_path for seen in self.requests]

    @property
    def accept_encodings(self) -> list[str]:
        return [seen.headers.get("accept-encoding", "") for seen in self.requests]


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as srv:
        yield srv


# --- zips, folders, fixtures ------------------------------------------------------------------


def make_zip(files: dict[str, bytes | str], *, infos: list[zipfile.ZipInfo] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        for info in infos or []:
            zf.writestr(info, b"target")
    return buffer.getvalue()


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under root (hidden ones included) with file contents; None for folders."""
    out: dict[str, bytes | None] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            path = os.path.join(dirpath, f)
            out[os.path.relpath(path, root)] = Path(path).read_bytes()
    return out


def listing(root: Path) -> list[str]:
    return sorted(os.listdir(root))


@pytest.fixture
def skills_dir(tmp_path: Path) -> Path:
    root = tmp_path / "skills"
    (root / "keeper" / "scripts").mkdir(parents=True)
    (root / "keeper" / "SKILL.md").write_text(
        GOOD_MD.format(name="keeper", desc="Must survive."), encoding="utf-8"
    )
    (root / "keeper" / "notes.md").write_text("# notes", encoding="utf-8")
    (root / "keeper" / "scripts" / "run.sh").write_text("echo keep", encoding="utf-8")
    return root


@pytest.fixture
async def manager(skills_dir: Path) -> SkillManager:
    m = SkillManager(skills_dir)
    await m.reload()
    assert m.names() == ["keeper"]
    return m


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    s = await Store.open(tmp_path / "data")
    yield s
    await s.close()


@pytest.fixture
def installer(manager: SkillManager, server: Server, store: Store) -> SkillInstaller:
    return SkillInstaller(
        manager, allow_private_hosts=LOCAL, oplog=store.oplog, codeload_base=server.url("/codeload")
    )


async def refused(
    installer: SkillInstaller, skills_dir: Path, match: str, **kwargs: object
) -> SkillInstallError:
    """Install must fail with ``match`` and leave the folder and the registry untouched."""
    before = tree(skills_dir)
    names = installer.manager.names()
    with pytest.raises(SkillInstallError, match=match) as info:
        await installer.install(**kwargs)  # type: ignore[arg-type]
    assert tree(skills_dir) == before
    assert installer.manager.names() == names
    return info.value


# --- good installs ----------------------------------------------------------------------------


async def test_zip_with_one_top_folder_installs_and_hot_reloads(
    installer: SkillInstaller, server: Server, skills_dir: Path, store: Store
) -> None:
    url = server.serve(
        "/dl/pdf.zip",
        make_zip(
            {
                "pdf-skill/SKILL.md": GOOD_MD.format(name="pdf", desc="Fill PDF forms."),
                "pdf-skill/reference.md": "# forms",
                "pdf-skill/scripts/fill.py": "print('fill')",
                "__MACOSX/pdf-skill/._SKILL.md": "junk",
            }
        ),
    )
    done = await installer.install(url=url, actor="user", session="nb:x")
    skill = done.skill
    assert not done.replaced
    assert skill.name == "pdf" and skill.description == "Fill PDF forms."
    assert skill.folder == (skills_dir / "pdf").absolute()  # folder named after the frontmatter
    assert list(skill.references) == ["reference.md"]
    assert (skills_dir / "pdf" / "scripts" / "fill.py").read_text() == "print('fill')"
    assert not (skills_dir / "pdf" / "__MACOSX").exists()
    assert installer.manager.names() == ["keeper", "pdf"]
    assert "<name>pdf</name>" in installer.manager.registry_prompt()
    assert listing(skills_dir) == ["keeper", "pdf"]  # no staging left
    (entry,) = await store.oplog.list(category="skill")
    assert (entry.action, entry.actor, entry.session) == ("skill_install", "user", "nb:x")
    assert "installed 'pdf' at pdf/SKILL.md from " + url == entry.detail


async def test_zip_with_root_skill_md_and_an_explicit_name(
    installer: SkillInstaller, server: Server, skills_dir: Path
) -> None:
    url = server.serve(
        "/flat.zip", make_zip({"SKILL.md": GOOD_MD.format(name="flat", desc="Flat."), "a.txt": "a"})
    )
    done = await installer.install(url=url, name="my-flat")
    assert done.skill.name == "flat"
    assert done.skill.location == "my-flat/SKILL.md"
    assert (skills_dir / "my-flat" / "a.txt").read_text() == "a"


async def test_github_repository_url_falls_back_from_main_to_master(
    installer: SkillInstaller, server: Server, skills_dir: Path
) -> None:
    server.serve(
        "/codeload/acme/slides/zip/refs/heads/master",
        make_zip({"slides-master/SKILL.md": GOOD_MD.format(name="slides", desc="Make slides.")}),
    )
    done = await installer.install(url="https://github.com/acme/slides")
    assert server.paths == [
        "/codeload/acme/slides/zip/refs/heads/main",
        "/codeload/acme/slides/zip/refs/heads/master",
    ]
    assert done.skill.name == "slides"
    assert (skills_dir / "slides" / "SKILL.md").is_file()


async def test_github_repository_without_main_or_master_is_refused(
    installer: SkillInstaller, skills_dir: Path
) -> None:
    await refused(
        installer,
        skills_dir,
        r"acme/none: no branch could be downloaded \(main \(HTTP 404\), master \(HTTP 404\)\)",
        url="https://github.com/acme/none.git",
    )


async def test_skill_md_url_installs_as_content(
    installer: SkillInstaller, server: Server, skills_dir: Path
) -> None:
    url = server.serve(
        "/raw/weather/SKILL.md", GOOD_MD.format(name="weather", desc="Forecasts.").encode()
    )
    done = await installer.install(url=url)
    assert done.skill.name == "weather"
    assert (skills_dir / "weather" / "SKILL.md").read_text(encoding="utf-8").startswith("---")


async def test_raw_content_installs_and_replacing_the_same_skill_updates_it(
    installer: SkillInstaller, skills_dir: Path
) -> None:
    first = await installer.install(content=GOOD_MD.format(name="notes", desc="v1"))
    (skills_dir / "notes" / "old.md").write_text("stale reference")
    second = await installer.install(content=GOOD_MD.format(name="notes", desc="v2"))
    assert not first.replaced and second.replaced
    assert second.skill.description == "v2"
    assert not (skills_dir / "notes" / "old.md").exists()  # the old version is gone entirely
    assert listing(skills_dir) == ["keeper", "notes"]


# --- refused installs: the folder stays as it was ---------------------------------------------


async def test_zip_slip_entry_is_refused(installer, server, skills_dir) -> None:
    url = server.serve(
        "/slip.zip",
        make_zip({"s/SKILL.md": GOOD_MD.format(name="s", desc="d"), "s/../../evil.txt": "x"}),
    )
    await refused(installer, skills_dir, r"'s/../../evil.txt' climbs out", url=url)
    assert not (skills_dir.parent / "evil.txt").exists()


async def test_absolute_path_entry_is_refused(installer, server, skills_dir) -> None:
    url = server.serve(
        "/abs.zip", make_zip({"SKILL.md": GOOD_MD.format(name="a", desc="d"), "/tmp/evil": "x"})
    )
    await refused(installer, skills_dir, r"'/tmp/evil' has an absolute path", url=url)


async def test_symlink_entry_is_refused(installer, server, skills_dir) -> None:
    link = zipfile.ZipInfo("s/link")
    link.create_system = 3
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    url = server.serve(
        "/link.zip", make_zip({"s/SKILL.md": GOOD_MD.format(name="s", desc="d")}, infos=[link])
    )
    await refused(installer, skills_dir, r"'s/link' is a symbolic link", url=url)


async def test_more_than_500_entries_are_refused(installer, server, skills_dir) -> None:
    files: dict[str, bytes | str] = {f"s/f{i}.txt": "x" for i in range(500)}
    files["s/SKILL.md"] = GOOD_MD.format(name="s", desc="d")
    url = server.serve("/many.zip", make_zip(files))
    await refused(installer, skills_dir, "has 501 entries, more than the limit of 500", url=url)


async def test_zip_bomb_stops_extracting_once_past_the_limit(
    manager: SkillManager, server: Server, skills_dir: Path
) -> None:
    limit, member = 1024 * 1024, 2 * 1024 * 1024
    bomb = make_zip({"SKILL.md": GOOD_MD.format(name="b", desc="d"), "zeros.bin": b"\0" * member})
    assert len(bomb) < 64 * 1024  # small download, large content
    installer = SkillInstaller(manager, allow_private_hosts=LOCAL, max_unpacked_bytes=limit)
    error = await refused(
        installer, skills_dir, "expands past the limit", url=server.serve("/bomb.zip", bomb)
    )
    stopped = int(re.search(r"stopped after (\d+) bytes", str(error)).group(1))  # type: ignore[union-attr]
    assert limit < stopped <= limit + installer.limits.chunk_size < member


async def test_a_body_that_is_not_a_zip_is_refused(installer, server, skills_dir) -> None:
    url = server.serve("/page", b"<!DOCTYPE html><html>a web page</html>")
    await refused(installer, skills_dir, r"not a zip archive .*HTML page", url=url)


async def test_zip_without_skill_md_in_the_expected_place_is_refused(
    installer, server, skills_dir
) -> None:
    url = server.serve("/two.zip", make_zip({"a/SKILL.md": "x", "b/readme.txt": "y"}))
    await refused(installer, skills_dir, r"SKILL.md not found.*has: a, b\)", url=url)
    repo = make_zip({"skills-main/skills/pdf/SKILL.md": "x", "skills-main/README.md": "y"})
    url = server.serve("/repo.zip", repo)
    await refused(installer, skills_dir, r"has: skills-main\); it holds skills deeper", url=url)


async def test_oversized_download_stops_early(
    manager: SkillManager, server: Server, skills_dir: Path
) -> None:
    installer = SkillInstaller(manager, allow_private_hosts=LOCAL, max_download_bytes=100_000)
    streamed = server.serve("/huge.zip", b"z" * 2_000_000, content_length=False)
    error = await refused(installer, skills_dir, "larger than the limit of 100000", url=streamed)
    stopped = int(re.search(r"stopped after (\d+) bytes", str(error)).group(1))  # type: ignore[union-attr]
    assert 100_000 < stopped < 2_000_000
    declared = server.serve("/declared.zip", b"z" * 200_000)
    await refused(installer, skills_dir, "200000 bytes, more than the limit", url=declared)


async def test_slow_download_times_out(manager: SkillManager, server, skills_dir) -> None:
    installer = SkillInstaller(manager, allow_private_hosts=LOCAL, timeout=0.2)
    url = server.serve("/slow.zip", b"x" * 10, stall=True)
    await refused(installer, skills_dir, "took longer than 0.2 s", url=url)


async def test_http_errors_and_bad_urls_are_refused(installer, server, skills_dir) -> None:
    error = await refused(installer, skills_dir, "HTTP 404", url=server.url("/missing.zip"))
    assert error.status_code == 404 and error.source == server.url("/missing.zip")
    await refused(installer, skills_dir, "only http:// and https://", url="ftp://x/y.zip")
    await refused(installer, skills_dir, "only http:// and https://", url="file:///etc/passwd")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "exactly one of url"),
        ({"url": "http://127.0.0.1:1/a.zip", "content": "x"}, "exactly one of url"),
        ({"content": "x", "name": "a/b"}, "must not contain '/'"),
        ({"content": "x", "name": "..\\up"}, "not start with '.'"),
        ({"content": "x", "name": "a\\b"}, "must not contain '/', '\\\\'"),
        ({"content": "x", "name": ".hidden"}, "not start with '.'"),
        ({"content": "x", "name": ".."}, "not start with '.'"),
        ({"content": "x" * (256 * 1024 + 1)}, "more than the limit of 262144"),
        ({"content": "# just text\n"}, "no description"),
        ({"content": "---\nname: [x\n---\n"}, "SKILL.md is invalid: the frontmatter is not valid"),
        ({"content": GOOD_MD.format(name="keeper", desc="d"), "name": "k2"}, "already exists"),
    ],
)
async def test_bad_content_and_names_are_refused(
    installer: SkillInstaller, skills_dir: Path, kwargs: dict[str, object], match: str
) -> None:
    await refused(installer, skills_dir, match, **kwargs)


async def test_another_skills_folder_is_never_overwritten(installer, skills_dir) -> None:
    other = GOOD_MD.format(name="intruder", desc="d")
    await refused(installer, skills_dir, "folder 'keeper' holds the skill 'keeper'", content=other,
                  name="keeper")  # fmt: skip
    (skills_dir / "data").mkdir()
    (skills_dir / "data" / "precious.csv").write_text("1,2")
    await refused(installer, skills_dir, "is not a skill", content=other, name="data")


async def test_whitelisted_out_skill_is_refused(skills_dir: Path, server: Server) -> None:
    manager = SkillManager(skills_dir, whitelist=["keeper"])
    await manager.reload()
    installer = SkillInstaller(manager, allow_private_hosts=LOCAL)
    await refused(
        installer, skills_dir, "'other' is not in the skills whitelist \\(keeper\\)",
        content=GOOD_MD.format(name="other", desc="d"),
    )  # fmt: skip


def test_swap_in_restores_the_old_version_when_the_move_fails(skills_dir: Path) -> None:
    before = tree(skills_dir)
    with pytest.raises(SkillInstallError, match="cannot move the skill into place"):
        _swap_in(skills_dir / ".upload-missing", skills_dir / "keeper")
    assert tree(skills_dir) == before


# --- removal, op log, tools -------------------------------------------------------------------


async def test_remove_deletes_the_folder_reloads_and_logs(
    installer: SkillInstaller, skills_dir: Path, store: Store
) -> None:
    await installer.install(content=GOOD_MD.format(name="temp", desc="d"))
    removed = await installer.remove(" temp ", actor="ai", session="nb:y")
    assert not (skills_dir / "temp").exists()
    assert installer.manager.names() == ["keeper"]
    assert getattr(removed, "name", None) == "temp"
    with pytest.raises(SkillInstallError, match="no skill named 'ghost'; installed skills: keeper"):
        await installer.remove("ghost")
    actions = [(r.action, r.detail.split(" ")[0]) for r in await store.oplog.list()]
    assert actions == [
        ("skill_remove", "failed"),
        ("skill_remove", "removed"),
        ("skill_install", "installed"),
    ]


async def test_a_broken_skill_can_be_removed_by_its_folder(
    installer: SkillInstaller, skills_dir: Path
) -> None:
    (skills_dir / "broken").mkdir()
    (skills_dir / "broken" / "SKILL.md").write_text("---\nname: [\n---\n")
    await installer.manager.refresh()
    assert installer.manager.errors
    await installer.remove("broken")
    assert not (skills_dir / "broken").exists()
    assert installer.manager.errors == []


async def test_failed_installs_are_logged_too(installer, server, store: Store) -> None:
    with pytest.raises(SkillInstallError):
        await installer.install(url=server.url("/nothing.zip"), session="nb:z")
    (entry,) = await store.oplog.list()
    assert entry.action == "skill_install" and entry.session == "nb:z"
    assert entry.detail.startswith(f"failed ({server.url('/nothing.zip')}): ")


async def test_tools_install_list_and_remove_through_an_injected_client(
    manager: SkillManager, server: Server, store: Store, skills_dir: Path
) -> None:
    url = server.serve("/t.zip", make_zip({"SKILL.md": GOOD_MD.format(name="t", desc="Tee.")}))
    async with httpx2.AsyncClient() as client:
        tools = {
            t.name: t
            for t in skill_tools(
                manager,
                self_manage=True,
                oplog=store.oplog,
                http_client=client,
                allow_private_hosts=LOCAL,
            )
        }
        ctx = ToolContext(session="nb:tools", sender="alice")
        text = await tools["skill_install"].invoke({"url": url}, ctx)
    assert text.startswith("Skill 't' installed and active: Tee. (location t/SKILL.md")
    shown = await tools["skill_list"].invoke({}, ctx)
    assert shown.splitlines() == [
        "Installed skills (2):",
        "- keeper: Must survive. (location keeper/SKILL.md, references 1, files 1)",
        "- t: Tee. (location t/SKILL.md, references 0, files 0)",
    ]
    with pytest.raises(ToolError, match="give exactly one of url"):
        await tools["skill_install"].invoke({}, ctx)
    assert "removed (t/SKILL.md)" in await tools["skill_remove"].invoke({"name": "t"}, ctx)
    entries = await store.oplog.list(session="nb:tools")
    assert [(e.category, e.action, e.actor) for e in entries] == [
        ("ai", "skill_remove", "alice"),
        ("ai", "skill_install", "alice"),  # the refused call is audited too
        ("ai", "skill_install", "alice"),
    ]
    assert listing(skills_dir) == ["keeper"]


# --- compressed transfers and linked folders (issue 10 item 9) ---------------------------------


async def test_a_gzip_encoded_zip_is_decoded_and_installed(installer, server, skills_dir) -> None:
    files = {"weather/SKILL.md": GOOD_MD.format(name="weather", desc="Forecasts.")}
    files["weather/data.txt"] = "sunny " * 1000
    plain = make_zip(files)
    gz = server.serve("/gz.zip", gzip.compress(plain), headers={"Content-Encoding": "gzip"})
    installed = await installer.install(url=gz)
    assert installed.skill.name == "weather"
    assert (skills_dir / "weather" / "data.txt").read_text() == "sunny " * 1000
    assert server.accept_encodings[-1] == "identity"  # we asked for a plain body
    deflated = server.serve(
        "/deflate.zip", zlib.compress(plain), headers={"Content-Encoding": "deflate"}
    )
    assert (await installer.install(url=deflated)).replaced


async def test_a_compressed_bomb_stops_at_the_limit(manager, server, skills_dir) -> None:
    """20 MB of zeros gzip to about 20 KB: the cap applies to the decoded bytes, and no more
    than the cap is ever decoded (one network chunk must not inflate in memory)."""
    limit = 1_000_000
    installer = SkillInstaller(manager, allow_private_hosts=LOCAL, max_download_bytes=limit)
    bomb = gzip.compress(b"\0" * 20_000_000)
    assert len(bomb) < limit
    url = server.serve("/bomb.zip", bomb, headers={"Content-Encoding": "gzip"})
    error = await refused(installer, skills_dir, f"larger than the limit of {limit}", url=url)
    stopped = int(re.search(r"stopped after (\d+) bytes", str(error)).group(1))  # type: ignore[union-attr]
    assert limit < stopped < 2 * limit


async def test_undecodable_encodings_are_refused_clearly(installer, server, skills_dir) -> None:
    zipped = make_zip({"SKILL.md": GOOD_MD.format(name="b", desc="d")})
    brotli = server.serve("/br.zip", zipped, headers={"Content-Encoding": "br"})
    await refused(
        installer, skills_dir, r"compressed as 'br', which the installer cannot", url=brotli
    )
    fake = server.serve("/fake.zip", zipped, headers={"Content-Encoding": "gzip"})
    await refused(installer, skills_dir, "marked as compressed but does not decompress", url=fake)
    cut = server.serve(
        "/cut.zip", gzip.compress(zipped)[:-30], headers={"Content-Encoding": "gzip"}
    )
    await refused(installer, skills_dir, "ended early", url=cut)


async def test_a_linked_skills_folder_is_followed(tmp_path: Path, server: Server) -> None:
    """skills.dir may be a symlink the user made: installs land in the folder it points to."""
    real = tmp_path / "real-skills"
    real.mkdir()
    link = tmp_path / "skills"
    link.symlink_to(real, target_is_directory=True)
    manager = SkillManager(link)
    await manager.reload()
    installer = SkillInstaller(manager, allow_private_hosts=LOCAL)
    zipped = make_zip({"pdf/SKILL.md": GOOD_MD.format(name="pdf", desc="PDFs.")})
    url = server.serve("/pdf.zip", zipped)
    installed = await installer.install(url=url)
    assert installed.skill.name == "pdf" and not installed.replaced
    assert link.is_symlink() and listing(real) == ["pdf"]  # no staging left behind
    assert (await installer.install(url=url)).replaced
    await installer.remove("pdf")
    assert link.is_symlink() and listing(real) == [] and manager.names() == []


async def test_a_dangling_skills_link_is_refused_and_left_alone(tmp_path, server) -> None:
    link = tmp_path / "skills"
    link.symlink_to(tmp_path / "gone", target_is_directory=True)
    installer = SkillInstaller(SkillManager(link), allow_private_hosts=LOCAL)
    with pytest.raises(SkillInstallError, match=r"is a link to .*gone, which does not exist"):
        await installer.install(content=GOOD_MD.format(name="x", desc="d"))
    assert link.is_symlink() and not (tmp_path / "gone").exists()


async def test_a_linked_skill_is_never_overwritten(installer, server, skills_dir, tmp_path):
    """A link inside the skills folder (made by the user, never by an archive) is not followed
    by installs: the folder it points to stays as it was."""
    outside = tmp_path / "outside" / "linked"
    outside.mkdir(parents=True)
    (outside / "SKILL.md").write_text(GOOD_MD.format(name="linked", desc="Mine."))
    (skills_dir / "linked").symlink_to(outside, target_is_directory=True)
    await installer.manager.refresh()
    assert "linked" in installer.manager.names()
    before = tree(outside)
    url = server.serve(
        "/linked.zip", make_zip({"linked/SKILL.md": GOOD_MD.format(name="linked", desc="New.")})
    )
    await refused(installer, skills_dir, "is a link to a folder elsewhere", url=url)
    assert tree(outside) == before and (skills_dir / "linked").is_symlink()
