"""Debian packages for the English-German corpus: which packages apt knows,
downloading them with ``apt-get download`` into a cache, and reading files out
of a .deb (dpkg-deb, or the ar and tar archives unpacked in Python)."""
import io
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.parse
from pathlib import Path


# Wesnoth campaign packages are named wesnoth-BRANCH-ABBREV; these are not campaigns.
WESNOTH_NOT_TEXT = {"core", "music", "server", "tools", "data"}


# --------------------------------------------------------------------------
# Debian packages


class Source:
    def __init__(self, name, description, packages, reader):
        self.name, self.description = name, description
        self.packages, self.reader = packages, reader


def run(command, **kwargs):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, **kwargs)


def known_packages(prefix, cache):
    """Names of the packages starting with `prefix` that apt (or else the cache) knows."""
    names = []
    if shutil.which("apt-cache"):
        names = run(["apt-cache", "pkgnames", prefix]).stdout.split()
    if not names:  # offline without apt lists: use what the cache holds
        names = [deb.name.split("_")[0] for deb in Path(cache).glob(prefix + "*.deb")]
    return sorted(set(names))


def newest(pattern, cache):
    """The package matching `pattern` (version in group 1, e.g. gcc-(\\d+)-locales)
    with the highest version, e.g. ``gcc-12-locales``."""
    regex = re.compile(f"^{pattern}$")
    prefix = pattern[:pattern.index("(")]
    matches = [(tuple(map(int, m.group(1).split("."))), m.group(0))
               for m in map(regex.match, known_packages(prefix, cache)) if m]
    if not matches:
        sys.exit(f"error: apt-cache knows no package named {pattern}; run `apt-get update` "
                 "(as root), or leave its source out with --sources")
    return max(matches)[1]


def wesnoth_packages(cache):
    """The data and campaign packages of the newest Wesnoth branch."""
    data = newest(r"wesnoth-(\d+\.\d+)-data", cache)
    branch = data[len("wesnoth-"):-len("-data")]
    campaign = re.compile(rf"^wesnoth-{re.escape(branch)}-([a-z]+)$")
    return [data] + [name for name in known_packages(f"wesnoth-{branch}-", cache)
                     if campaign.match(name)
                     and campaign.match(name).group(1) not in WESNOTH_NOT_TEXT]


def cached_deb(cache, package):
    debs = sorted(Path(cache).glob(f"{package}_*.deb"))
    return debs[-1] if debs else None


def download(packages, cache):
    """{package: .deb path}; downloads the packages that the cache lacks."""
    cache = Path(cache)
    cache.mkdir(parents=True, exist_ok=True)
    missing = [p for p in packages if cached_deb(cache, p) is None]
    if missing:
        if not shutil.which("apt-get"):
            sys.exit("error: apt-get not found; put the .deb files of these packages in "
                     f"{cache}: {' '.join(missing)}")
        print(f"Downloading {len(missing)} packages into {cache}: {' '.join(missing)}")
        # Download into a scratch folder and move complete files only.
        with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as scratch:
            result = run(["apt-get", "download", *missing], cwd=scratch)
            if result.returncode:
                errors = [line for line in result.stderr.splitlines()
                          if not line.startswith("W:")] or result.stderr.splitlines()
                hint = ("the package is unknown to apt: run `apt-get update` (as root), or "
                        "leave its source out with --sources"
                        if "Unable to locate" in result.stderr or "no installation candidate"
                        in result.stderr else
                        "is the Debian mirror reachable? Without network, put the .deb files "
                        f"in {cache} (see --cache)")
                sys.exit("error: `apt-get download` failed:\n  " + "\n  ".join(errors[-8:])
                         + f"\n{hint}")
            for deb in Path(scratch).glob("*.deb"):
                deb.rename(cache / deb.name)
    debs = {p: cached_deb(cache, p) for p in packages}
    lost = [p for p, deb in debs.items() if deb is None]
    if lost:
        sys.exit(f"error: apt-get download gave no .deb for: {' '.join(lost)}")
    return debs


def read_ar(stream):
    """{member name: bytes} of an ar archive (the container of a .deb)."""
    if stream.read(8) != b"!<arch>\n":
        raise ValueError("not an ar archive")
    members = {}
    while True:
        header = stream.read(60)
        if len(header) < 60:
            return members
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        members[name] = stream.read(size)
        if size % 2:
            stream.read(1)


def open_data_tar(deb):
    """A streaming tarfile of the package's files, and a function to finish it."""
    if shutil.which("dpkg-deb"):
        process = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)

        def finish():
            process.stdout.close()
            error = process.stderr.read().decode(errors="replace")
            if process.wait():
                sys.exit(f"error: dpkg-deb could not read {deb}: {error.strip()}")
        return tarfile.open(fileobj=process.stdout, mode="r|"), finish
    # No dpkg-deb: unpack the ar container (debian-binary, control.tar.*, data.tar.*).
    with open(deb, "rb") as stream:
        members = read_ar(stream)
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        sys.exit(f"error: {deb} has no data.tar member")
    data = members[name]
    if name.endswith(".zst"):
        if not shutil.which("zstd"):
            sys.exit(f"error: {deb} is zstd-compressed: install dpkg or zstd")
        data = subprocess.run(["zstd", "-dc"], input=data, stdout=subprocess.PIPE,
                              check=True).stdout
    return tarfile.open(fileobj=io.BytesIO(data), mode="r:*"), lambda: None


def deb_files(deb, wanted, links=None):
    """[(path, bytes)] of the regular files in a .deb whose path `wanted` accepts.

    Symbolic links that `wanted` accepts go into the dict `links` {path: target}.
    """
    tar, finish = open_data_tar(deb)
    files = []
    with tar:
        for member in tar:
            path = member.name.lstrip("./")
            if member.isfile() and wanted(path):
                files.append((path, tar.extractfile(member).read()))
            elif member.issym() and links is not None and wanted(path):
                links[path] = member.linkname
    finish()
    return files


def package_version(deb):
    """Version of a .deb from its file name (name_version_arch.deb)."""
    parts = deb.name.split("_")
    return urllib.parse.unquote(parts[1]) if len(parts) == 3 else "?"
