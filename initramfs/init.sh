#!/bin/sh
# /init of the Better Compute ramdisk (PID 1). Mounts the pseudo-filesystems, loads the
# modules for virtio disks and networking, brings the network up by DHCP, then runs the
# agent and restarts it whenever it exits. Settings come from the kernel command line
# (bc.* parameters), which the agent reads itself from /proc/cmdline.
#
# Node role (an installed OS booted with this ramdisk as its userland): when the command line
# names bc.root=DEVICE, that filesystem is mounted on /sysroot and the agent, its settings
# and its state are taken from there (see qemu/README.md).
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export LANG=C.UTF-8 PYTHONUNBUFFERED=1 HOME=/root
# Until the agent runs, everything here is on the boot's critical path, and under software
# emulation each program started costs ~0.1 s: so only the mounts start programs before it;
# the rest is shell built-ins (read, echo to /proc) or runs in the background.

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mount -t tmpfs -o mode=0755,nosuid,nodev run /run
mount -t tmpfs -o mode=1777,nosuid,nodev tmp /tmp
# The TPM (attestation, docs/attestation.md): its driver where the kernel has it as modules
# (arm64's cloud kernel; x86's has it built in and its ramdisk no list), loaded before the agent
# starts, which looks for /dev/tpmrm0 once; then the firmware's event log, where there is a TPM.
if [ -f /usr/share/bettercompute/modules.tpm ]; then
	while read -r m; do
		insmod "/lib/modules/$m" 2>/dev/null || echo "bc-init: module $m did not load"
	done </usr/share/bettercompute/modules.tpm
fi
[ -e /sys/class/tpm/tpm0 ] && mount -t securityfs securityfs /sys/kernel/security
exec </dev/console >/dev/console 2>&1

read -r CMDLINE </proc/cmdline
say() {
	read -r up _ </proc/uptime
	echo "bc-init [$up]: $*"
}
arg() {  # arg NAME: $v = the value of NAME= on the kernel command line (last one wins)
	v=""
	set -f  # split the command line into words, but never expand a * or ? in it into file names
	for w in $CMDLINE; do
		case "$w" in "$1="*) v="${w#*=}" ;; esac
	done
	set +f
}
wait_for() {  # wait_for FILE [TENTHS]: until it exists, at most TENTHS tenths of a second (~30 s)
	i=0
	while [ ! -e "$1" ] && [ $i -lt "${2:-300}" ]; do
		sleep 0.1
		i=$((i + 1))
	done
}

# Virtual media (booted from the ISO, whose command line says bc.media=cdrom): the node's
# config medium, a second CD labelled BC_CONFIG that the site made for it (agent/site/boot/vmedia.py),
# holds what DHCP and the kernel command line would give: "network" (the static address of
# one NIC, named by MAC), "cmdline" (bc.* settings: node id, gateway, token, ...) and ca.pem.
# It is mounted read-only on /run/bettercompute/media; its cmdline is added to the kernel's
# for the agent. Without the medium the network comes up by DHCP as for a PXE boot. Bad
# content is said on the console and in the kernel log, and the network falls back to DHCP:
# the ramdisk stays up for an operator, it never reboots over it.
#
# An installed node (bc.root, below) without DHCP keeps the same "network" file on its disk,
# /etc/bettercompute/network, which is used the same way once its root is mounted.
MEDIA_DIR=/run/bettercompute/media
KMSG=/dev/kmsg
NODE_NETWORK=/sysroot/etc/bettercompute/network
net_source="config medium"
media_error() {
	say "$net_source: $*; falling back to DHCP"
	echo "bc-init: $net_source: $*; falling back to DHCP" >>"$KMSG" 2>/dev/null
}
ipv4() {  # ipv4 TEXT: a dotted quad, each part 0-255 without leading zeros
	case "$1" in "" | *[!0-9.]* | .* | *. | *..*) return 1 ;; esac
	set -f
	old_ifs="$IFS"; IFS=.
	set -- $1
	IFS="$old_ifs"
	set +f
	[ $# -eq 4 ] || return 1
	for o; do
		case "$o" in 0?*) return 1 ;; esac
		[ "$o" -le 255 ] || return 1
	done
}
small() {  # small FILE MAX: FILE exists and holds at most MAX bytes
	[ -f "$1" ] || return 1
	n=$(wc -c <"$1")
	[ "$n" -le "$2" ]
}
media_mount() {  # the config medium on $MEDIA_DIR, waiting for the CD drives (~15 s at most)
	while read -r m; do
		insmod "/lib/modules/$m" 2>/dev/null || say "module $m did not load"
	done </usr/share/bettercompute/modules.media
	mkdir -p "$MEDIA_DIR"
	i=0
	while [ $i -lt 150 ]; do
		dev="$(findfs LABEL=BC_CONFIG 2>/dev/null)"
		if [ -n "$dev" ]; then
			mount -t iso9660 -o ro,nodev,nosuid,noexec "$dev" "$MEDIA_DIR" && return 0
			media_error "$dev (BC_CONFIG) did not mount"
			return 1
		fi
		sleep 0.1
		i=$((i + 1))
	done
	say "booted from virtual media without a config medium (no BC_CONFIG): DHCP"
	return 1
}
media_network() {  # the medium's settings, and its NIC up statically; 1: use DHCP instead
	media_mount || { : >/run/bc-media-done; return 1; }
	if small "$MEDIA_DIR/cmdline" 4096; then
		read -r extra <"$MEDIA_DIR/cmdline"
		echo "$CMDLINE $extra" >/run/bettercompute/cmdline
	elif [ -e "$MEDIA_DIR/cmdline" ]; then
		media_error "cmdline is larger than 4096 bytes"
	fi
	: >/run/bc-media-done
	static_network "$MEDIA_DIR/network"
}
static_network() {  # static_network FILE: the NIC FILE names up with its address; 1: DHCP
	if [ ! -e "$1" ]; then
		media_error "no network file"
		return 1
	elif ! small "$1" 4096; then
		media_error "network is larger than 4096 bytes"
		return 1
	fi
	mac="" address="" prefix="" gateway="" dns=""
	while IFS='=' read -r key value; do
		case "$key" in
		mac) mac="$value" ;; address) address="$value" ;; prefix) prefix="$value" ;;
		gateway) gateway="$value" ;; dns) dns="$value" ;;
		"" | "#"*) ;;
		*) media_error "network: unknown key '$key'"; return 1 ;;
		esac
	done <"$1"
	case "$mac" in
	[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]) ;;
	*) media_error "network: mac '$mac' is not a MAC address (aa:bb:cc:dd:ee:ff)"; return 1 ;;
	esac
	ipv4 "$address" || { media_error "network: address '$address' is not an IPv4 address"; return 1; }
	case "$prefix" in "" | *[!0-9]* | 0?*) prefix=99 ;; esac
	[ "$prefix" -ge 1 ] && [ "$prefix" -le 32 ] || { media_error "network: prefix must be 1-32"; return 1; }
	[ -z "$gateway" ] || ipv4 "$gateway" || { media_error "network: gateway '$gateway' is not an IPv4 address"; return 1; }
	for d in $dns; do
		ipv4 "$d" || { media_error "network: dns '$d' is not an IPv4 address"; return 1; }
	done
	nic="" seen=""
	for dev in /sys/class/net/*; do
		read -r a <"$dev/address" || continue
		[ "$a" = "$mac" ] && nic="${dev##*/}"
		seen="$seen ${dev##*/}=$a"
	done
	[ -n "$nic" ] || { media_error "network: no NIC has MAC $mac (NICs:$seen)"; return 1; }
	ip link set "$nic" up
	ip -4 addr add "$address/$prefix" dev "$nic" || { media_error "network: ip addr add failed"; return 1; }
	[ -z "$gateway" ] || ip -4 route replace default via "$gateway" dev "$nic" \
		|| { media_error "network: the default route via $gateway failed"; return 1; }
	: >/etc/resolv.conf
	for d in $dns; do echo "nameserver $d" >>/etc/resolv.conf; done
	say "network: $nic $address/$prefix static, from the $net_source (no DHCP)"
	return 0
}

# A UKI booted by the site (docs/attestation.md): one build for the site's nodes, whose
# embedded (measured) command line holds nothing per node but bc.site=http://<host>:<port>,
# the site's HTTP service. The node's bc.* settings (node id, gateway, token) are fetched from
# the site by MAC, /pxe/<mac-hyphen>.cmdline, once DHCP is up (each NIC's MAC tried; the site
# answers only the one with a live entry; for ~25 s), and added to the kernel's for the agent,
# as a config medium's are. Fetched with python3's http.client: busybox's wget segfaults here.
SITE_GET='import http.client as h,sys
c = h.HTTPConnection(sys.argv[1], timeout=5)
c.request("GET", sys.argv[2])
r = c.getresponse()
r.status == 200 or sys.exit(1)
sys.stdout.buffer.write(r.read(4097))'
site_settings() {
	mkdir -p /run/bettercompute
	server="${SITE#http://}"
	server="${server%/}"
	case "$SITE" in
	http://*) ;;
	*) server="" ;;
	esac
	case "$server" in
	"" | *[!A-Za-z0-9.:-]*)
		say "bc.site '$SITE' is not http://host:port: no settings from the site"
		: >/run/bc-site-done
		return ;;
	esac
	f=/run/bettercompute/site.cmdline
	read -r up _ </proc/uptime
	until=$((${up%.*} + 25))
	while :; do
		for dev in /sys/class/net/*; do
			[ "${dev##*/}" = lo ] && continue
			read -r a <"$dev/address" || continue
			python3 -I -S -c "$SITE_GET" "$server" "/pxe/$(echo "$a" | tr : -).cmdline" >"$f" 2>/dev/null \
				|| continue
			if small "$f" 4096; then
				read -r extra <"$f"
				echo "$CMDLINE $extra" >/run/bettercompute/cmdline
				say "settings: from the site $SITE for $a"
			else
				say "settings from the site $SITE for $a: larger than 4096 bytes; not used"
			fi
			rm -f "$f"
			: >/run/bc-site-done
			return
		done
		read -r up _ </proc/uptime
		[ "${up%.*}" -lt "$until" ] || break
		sleep 0.5
	done
	rm -f "$f"
	say "no settings from the site $SITE for any NIC's MAC; the agent starts without them"
	: >/run/bc-site-done
}

read -r release </proc/sys/kernel/osrelease
say "up, kernel $release"
arg bc.hostname
host="$v"
arg bc.media
MEDIA="$v"
arg bc.root
ROOT="$v"
arg bc.site
SITE="$v"
v="$host"
echo "${v:-bc-ramdisk}" >/proc/sys/kernel/hostname  # the agent's node id when bc.node is not given

# Drivers, then the network by DHCP on every wired interface (in parallel; the first lease wins
# the route), in the background: the agent starts meanwhile, on the other CPU. The NIC driver
# is the last module of the list, so every other driver is loaded before the network can come
# up, and no command can reach the agent before that: it only joins over the network. A dial
# that finds no route yet is retried at the minimum delay, not backed off. (Its files are in
# /usr/share/bettercompute: an installed node's directories are bound over /etc/bettercompute
# and /usr/lib/bettercompute below, maybe before DHCP has started.) The script says on the
# console which address each interface got.
(
	mkdir -p /dev/pts /dev/shm
	mount -t devpts devpts /dev/pts
	ip link set lo up
	while read -r m; do
		insmod "/lib/modules/$m" 2>/dev/null || say "module $m did not load"
	done </usr/share/bettercompute/modules
	# A UEFI boot's variables, for the release gate (inventory.refresh's expect.state).
	[ -d /sys/firmware/efi/efivars ] && mount -t efivarfs -o nosuid,nodev,noexec efivarfs /sys/firmware/efi/efivars
	: >/run/bc-modules-loaded
	if [ -n "$MEDIA" ] && media_network; then
		exit 0
	fi
	if [ -n "$ROOT" ]; then  # an installed node's own static network, once its root is mounted
		wait_for /run/bc-root-tried
		if [ -f "$NODE_NETWORK" ]; then
			net_source="node's /etc/bettercompute/network"
			static_network "$NODE_NETWORK" && exit 0
		fi
	fi
	for dev in /sys/class/net/*; do
		n="${dev##*/}"
		[ "$n" = lo ] && continue
		ip link set "$n" up
		udhcpc -i "$n" -s /usr/share/bettercompute/udhcpc.script -t 20 -T 1 -A 2 -q -n -f >/run/udhcpc.$n.log 2>&1 &
	done
	[ -z "$SITE" ] || site_settings
) &
[ -n "$MEDIA" ] && wait_for /run/bc-media-done
[ -n "$SITE" ] && wait_for /run/bc-site-done 600  # the modules, DHCP, then ~25 s at most

# Test ramdisks only (tests/e2e): extra environment for the agent, and a root shell on the
# second serial port (or on the port the marker file names: hvc0, a virtio console, on arm64's
# one-UART machine; its driver loads in the background), through which the harness drives the
# guest. Production images carry neither file.
[ -f /etc/bettercompute/agent.env ] && . /etc/bettercompute/agent.env
if [ -e /etc/bettercompute/debug-shell ]; then
	read -r tty </etc/bettercompute/debug-shell
	tty="/dev/${tty:-ttyS1}"
	say "TEST RAMDISK: root shell on ${tty#/dev/}"
	(wait_for "$tty"; stty -F "$tty" 115200 raw -echo 2>/dev/null; exec setsid sh <"$tty" >"$tty" 2>&1) &
fi
AGENT=/usr/lib/bettercompute/agent.pyz
NODE_DIRS="/etc/bettercompute /usr/lib/bettercompute /var/lib/bettercompute-agent"
set -- "$AGENT" run
[ -f /run/bettercompute/cmdline ] && set -- "$AGENT" run --cmdline-file /run/bettercompute/cmdline
root="$ROOT"
if [ -n "$root" ]; then
	wait_for /run/bc-modules-loaded  # the disk's driver
	mkdir -p /sysroot
	i=0
	while [ $i -lt 50 ]; do
		i=$((i + 1))
		mount -o rw "$root" /sysroot 2>/dev/null && break
		[ -b "$root" ] || root="$(findfs "$root" 2>/dev/null || echo "$root")"
		sleep 0.2
	done
	if mountpoint -q /sysroot; then
		# An installed node (`agent install --root`): its agent, settings and state are on
		# the disk at the paths its agent.json names; bind them into place and run the agent
		# the way its systemd unit does, through the launcher (daemon.upgrade's A/B half).
		say "node root $root mounted on /sysroot"
		for d in $NODE_DIRS; do
			[ -d "/sysroot$d" ] || continue
			mkdir -p "$d"
			mount --bind "/sysroot$d" "$d"
		done
		if [ -f /usr/lib/bettercompute/launcher.py ] && [ -f /etc/bettercompute/agent.json ]; then
			set -- /usr/lib/bettercompute/launcher.py "$AGENT" run --config /etc/bettercompute/agent.json
		fi
	else
		say "could not mount $root; staying in the ramdisk"
	fi
	: >/run/bc-root-tried
fi

# busybox reboot/poweroff/halt signal PID 1 (TERM/USR2/USR1): stop the agent, sync, unmount
# the node root, then do it. The agent runs in the background so that `wait` lets the trap in.
pid=""
finish() {
	say "$1 requested: stopping the agent"
	[ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
	i=0
	while [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
	sync
	for d in $NODE_DIRS; do mountpoint -q "$d" && umount "$d"; done
	mountpoint -q /sysroot && { umount /sysroot || mount -o remount,ro /sysroot; }
	"$1" -f
}
trap 'finish reboot' TERM
trap 'finish poweroff' USR2
trap 'finish halt' USR1

# One malloc arena per lane worker thread would keep their freed memory resident; two arenas
# hold the agent's idle RSS down (the lanes allocate little, and not at the same time).
export MALLOC_ARENA_MAX=2
say "starting agent: python3 $*"
while :; do
	python3 "$@" &
	pid=$!
	echo "$pid" >/run/bettercompute-agent.pid
	wait "$pid"
	rc=$?
	say "agent exited with status $rc; restarting in 1s"
	sleep 1
done
