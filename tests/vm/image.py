"""Host side of the VM test: build the .deb, a Debian 12 guest with it installed, boot it.

    python3 tests/vm/image.py      (or scripts/vm-test.sh, which runs the pytest test)

Steps, each timed (the test prints the times; docs/install.md has measured ones):
1. ``packaging/build-deb.sh`` builds dist/gpuwatchd_<version>_all.deb from the checkout.
2. tests/vm/module/xid_printk.c is built against the guest kernel's headers
   (linux-headers-<version> of the host's linux-image-amd64, which the guest boots).
3. ``mmdebstrap --variant=minbase`` builds the root file system from deb.debian.org with
   systemd and kmod only; ``apt-get install ./gpuwatchd_*.deb`` inside it pulls the
   package's real dependencies from Debian, as an operator's install would.
4. The guest's test files (tests/vm/guest/) are copied in and its test units enabled.
5. ``mke2fs -d`` makes the disk image (no mounts, no loop devices).
6. QEMU boots it (TCG by default; GPUWATCHD_VM_ACCEL=kvm to try KVM): the kernel and
   initrd are the host's /boot files, serial 0 is the console log, serial 1 carries the
   guest's JSON result lines. The guest reboots once (QEMU exits and boots the same disk
   again) and powers off at the end.

Everything lives in .cache/vm/ of the checkout (gitignored) and is rebuilt every run.
A step that cannot run raises ``VmError`` saying what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CACHE = ROOT / ".cache" / "vm"
MIRROR = os.environ.get("GPUWATCHD_VM_MIRROR", "http://deb.debian.org/debian")
BOOT_TIMEOUT = float(os.environ.get("GPUWATCHD_VM_TIMEOUT", "420"))
# What the guest needs besides Debian's minbase: an init, and insmod for the test module.
# The package's own dependencies come with it (apt-get install ./gpuwatchd_*.deb).
GUEST_PACKAGES = ["systemd", "systemd-sysv", "kmod"]
HOST_TOOLS = {
    "mmdebstrap": "mmdebstrap",
    "mke2fs": "e2fsprogs",
    "qemu-system-x86_64": "qemu-system-x86",
    "make": "make",
    "gcc": "gcc",
}


class VmError(Exception):
    """A step of the VM test could not run; the message says which and why."""


@dataclass
class Run:
    """What one VM run produced: per-step seconds, result lines, console output."""

    timings: dict[str, float] = field(default_factory=dict)
    results: list[dict[str, Any]] = field(default_factory=list)
    console: str = ""
    kernel: str = ""
    qemu_rc: int | None = None

    def by_check(self) -> dict[str, dict[str, Any]]:
        return {r["check"]: r for r in self.results}


def _run(argv: list[str], what: str, timeout: float, **kw: Any) -> str:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as exc:
        raise VmError(
            f"{what}: no result after {timeout:.0f} s ({' '.join(argv[:3])} ...)"
        ) from exc
    except FileNotFoundError as exc:
        raise VmError(f"{what}: {exc.filename} not found") from exc
    if p.returncode != 0:
        tail = (p.stdout + p.stderr)[-3000:]
        raise VmError(f"{what} failed (exit {p.returncode}):\n{tail}")
    return p.stdout


def guest_kernel() -> tuple[str, Path, Path, Path]:
    """Version, vmlinuz, initrd and headers of the Debian kernel the guest boots."""
    for vmlinuz in sorted(Path("/boot").glob("vmlinuz-*"), reverse=True):
        version = vmlinuz.name.removeprefix("vmlinuz-")
        initrd = Path(f"/boot/initrd.img-{version}")
        headers = Path(f"/usr/src/linux-headers-{version}")
        if initrd.is_file() and headers.is_dir():
            return version, vmlinuz, initrd, headers
    raise VmError(
        "no Debian kernel with initrd and headers in /boot and /usr/src: install "
        "linux-image-amd64 and linux-headers-amd64 (scripts/test.sh --setup does)"
    )


def check_host() -> None:
    missing = [pkg for tool, pkg in HOST_TOOLS.items() if shutil.which(tool) is None]
    if missing:
        raise VmError(
            f"missing host packages: {' '.join(sorted(set(missing)))} (scripts/test.sh --setup)"
        )
    if os.geteuid() != 0:
        raise VmError("mmdebstrap --mode=root and mke2fs -d need root to keep file owners")


def build_deb() -> Path:
    out = _run([str(ROOT / "packaging" / "build-deb.sh")], "packaging/build-deb.sh", 300)
    deb = ROOT / out.strip().splitlines()[-1]
    if not deb.is_file():
        raise VmError(f"packaging/build-deb.sh did not leave {deb}")
    return deb


def build_module(headers: Path) -> Path:
    work = CACHE / "module"
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(HERE / "module", work)
    _run(["make", "-C", str(headers), f"M={work}", "modules"], "building xid_printk.ko", 120)
    return work / "xid_printk.ko"


def build_rootfs(deb: Path, rootfs: Path) -> None:
    shutil.rmtree(rootfs, ignore_errors=True)
    hooks = [
        f'mkdir -p "$1/root/deb" && cp {deb} "$1/root/deb/"',
        'chroot "$1" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q '
        f"--no-install-recommends /root/deb/{deb.name}",
        'rm -rf "$1/root/deb"',
    ]
    argv = [
        "mmdebstrap",
        "--variant=minbase",
        "--mode=root",
        "--format=directory",
        f"--include={','.join(GUEST_PACKAGES)}",
        # Less to unpack: other packages' manuals, docs and translations (gpuwatchd's stay;
        # the test checks them).
        # (files only: the directories stay, so that gpuwatchd's own files can be unpacked)
        *[f"--dpkgopt=path-exclude=/usr/share/{d}/*/*" for d in ("man", "doc", "locale")],
        "--dpkgopt=path-include=/usr/share/man/man8/gpuwatchd.8.gz",
        "--dpkgopt=path-include=/usr/share/doc/gpuwatchd/*",
        "--aptopt=Acquire::Languages none",
        *[f"--customize-hook={h}" for h in hooks],
        "bookworm",
        str(rootfs),
        MIRROR,
    ]
    _run(argv, f"mmdebstrap from {MIRROR}", 600)


def install_guest_files(rootfs: Path, module: Path) -> None:
    guest = HERE / "guest"
    share = rootfs / "usr/local/share/vmcheck"
    share.mkdir(parents=True, exist_ok=True)
    for name in ("vmcheck.py", "scenario.yaml"):
        shutil.copy(guest / name, share / name)
    shutil.copy(module, share / "xid_printk.ko")
    shutil.copy(guest / "vm-drain-record", rootfs / "usr/local/sbin/vm-drain-record")
    (rootfs / "usr/local/sbin/vm-drain-record").chmod(0o755)
    # The operator's part: edit the config, choose the drain helper's mode, enable its socket.
    shutil.copy(guest / "gpuwatchd.yaml", rootfs / "etc/gpuwatchd/gpuwatchd.yaml")
    shutil.copy(guest / "gpuwatchd-drain.default", rootfs / "etc/default/gpuwatchd-drain")
    system = rootfs / "etc/systemd/system"
    wants = {
        "multi-user.target.wants": ["vmcheck.service", "vmcheck-receiver.service"],
        "sockets.target.wants": ["gpuwatchd-drain.socket"],
    }
    for unit in ("vmcheck.service", "vmcheck-receiver.service"):
        shutil.copy(guest / unit, system / unit)
    for target, units in wants.items():
        (system / target).mkdir(exist_ok=True)
        for unit in units:
            src = (
                f"/etc/systemd/system/{unit}"
                if unit.startswith("vmcheck")
                else f"/lib/systemd/system/{unit}"
            )
            link = system / target / unit
            link.unlink(missing_ok=True)
            link.symlink_to(src)
    # No udev in the guest: device units never appear, so a getty on a serial port would
    # hold the boot for 90 s. Nobody logs in; mask them.
    for unit in ("serial-getty@.service", "getty@.service"):
        (system / unit).unlink(missing_ok=True)
        (system / unit).symlink_to("/dev/null")
    (rootfs / "etc/hostname").write_text("vmguest\n")
    (rootfs / "var/log/journal").mkdir(parents=True, exist_ok=True)


def make_disk(rootfs: Path, disk: Path) -> None:
    disk.unlink(missing_ok=True)
    _run(
        ["mke2fs", "-q", "-t", "ext4", "-d", str(rootfs), "-L", "root", str(disk), "1G"],
        "mke2fs -d",
        120,
    )


def boot(run: Run, vmlinuz: Path, initrd: Path, disk: Path) -> None:
    """Boot until the guest powers off. Its reboot ends QEMU (-no-reboot) and the disk is
    booted again from cold: a warm reboot under TCG spent ~80 s before init here."""
    results = CACHE / "results.jsonl"
    results.unlink(missing_ok=True)
    accel = os.environ.get("GPUWATCHD_VM_ACCEL", "tcg")
    deadline = time.monotonic() + BOOT_TIMEOUT
    for n in (1, 2):
        console = CACHE / f"console-{n}.log"
        console.unlink(missing_ok=True)
        argv = [
            "qemu-system-x86_64", "-accel", accel, "-smp", "2", "-m", "1024",
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-kernel", str(vmlinuz), "-initrd", str(initrd),
            "-drive", f"file={disk},format=raw,if=virtio",
            # results: appended to, so that the second boot keeps the first boot's lines
            "-chardev", f"file,id=results,path={results},append=on",
            "-serial", f"file:{console}", "-serial", "chardev:results",
            "-append", "console=ttyS0 root=/dev/vda rw quiet systemd.show_status=0 panic=-1",
        ]  # fmt: skip
        try:
            p = subprocess.run(
                argv, capture_output=True, text=True, timeout=max(deadline - time.monotonic(), 1)
            )
            run.qemu_rc = p.returncode
            if p.returncode != 0:
                run.console += f"\nqemu exit {p.returncode}: {p.stderr[-2000:]}"
        except subprocess.TimeoutExpired:
            run.qemu_rc = None
            run.console += f"\nqemu: guest still running after {BOOT_TIMEOUT:.0f} s, killed"
        except FileNotFoundError as exc:
            raise VmError(f"qemu: {exc.filename} not found") from exc
        if console.exists():
            run.console += f"\n--- boot {n} console ---\n" + console.read_text(errors="replace")
        run.results = _read_results(results, run)
        if run.qemu_rc is None or "reboot" not in run.by_check() or "done" in run.by_check():
            break


def _read_results(path: Path, run: Run) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                run.console += f"\nunreadable result line: {line[:300]}"
    return out


def run_vm() -> Run:
    """Every step, timed. Raises VmError when a build step cannot run."""
    run = Run()
    check_host()
    CACHE.mkdir(parents=True, exist_ok=True)
    version, vmlinuz, initrd, headers = guest_kernel()
    run.kernel = version
    rootfs, disk = CACHE / "rootfs", CACHE / "disk.img"

    def step(name: str, fn: Any, *args: Any) -> Any:
        t0 = time.monotonic()
        out = fn(*args)
        run.timings[name] = round(time.monotonic() - t0, 1)
        return out

    t_all = time.monotonic()
    deb = step("build_deb", build_deb)
    module = step("build_module", build_module, headers)
    step("rootfs", build_rootfs, deb, rootfs)
    step("guest_files", install_guest_files, rootfs, module)
    step("disk_image", make_disk, rootfs, disk)
    shutil.rmtree(rootfs, ignore_errors=True)
    step("boot_and_checks", boot, run, vmlinuz, initrd, disk)
    run.timings["total"] = round(time.monotonic() - t_all, 1)
    (CACHE / "timings.json").write_text(json.dumps(run.timings, indent=1) + "\n")
    return run


if __name__ == "__main__":
    try:
        result = run_vm()
    except VmError as err:
        print(f"VM test: {err}", file=sys.stderr)
        sys.exit(2)
    for r in result.results:
        print(("ok   " if r["ok"] else "FAIL ") + r["check"], json.dumps(r["detail"])[:300])
    print("timings:", json.dumps(result.timings))
    sys.exit(0 if result.results and all(r["ok"] for r in result.results) else 1)
