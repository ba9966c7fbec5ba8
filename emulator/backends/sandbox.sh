# A process node, entered by the launch agent as `unshare --mount --uts --pid --kill-child ... sh
# sandbox.sh HOST DISK CACHE ROOT ENVFILE SHMBYTES COMMAND SOFTWARE...` (new mount, UTS and PID namespaces).
#
# It builds the view a docker node has, on a tmpfs at ROOT (a mount point only this namespace
# sees): this machine's SOFTWARE paths read-only at their own paths, a private /tmp, /dev/shm and
# /root, a minimal /dev, /proc of its own PID namespace (no other process is visible), the node's
# disk at /mnt/azureml (with the run's data runtime mounts in it) and its cache read-only at /mnt/amlemu/cache; nothing else of the host (no
# home folders, no emulator state, no Docker socket). Then it changes root and drops every
# capability, so the job's root can neither remount, mknod nor leave; the node's environment is
# only what ENVFILE (written by the platform) sets. When the agent dies, --kill-child ends this
# namespace's first process, and with it every process the job started, daemons included.
set -eu
chroot=$(command -v chroot) setpriv=$(command -v setpriv) tini=$(command -v tini)
host=$1 disk=$2 cache=$3 root=$4 envfile=$5 shm=$6 command=$7
shift 7

mount -t tmpfs -o mode=0755 amlemu-node "$root"
# Every folder in one mkdir and the usrmerge links in one cp: a process less per path (~4 ms each,
# paid by every launch on every node).
links="" dirs="" files=""
for dir in bin sbin lib lib32 lib64 libx32; do  # usrmerge links as they are, real folders bound
    if [ -L "/$dir" ]; then links="$links /$dir"; elif [ -d "/$dir" ]; then dirs="$dirs $root/$dir"; fi
done
for path in "$@"; do
    case $path in  # a path with a space (or glob) gets its own mkdir: the lists split on spaces
        *[[:space:]*?[]*) if [ -d "$path" ]; then mkdir -p "$root$path"; elif [ -e "$path" ]; then
                              mkdir -p "$root${path%/*}"; : >"$root$path"; fi ;;
        *) if [ -d "$path" ]; then dirs="$dirs $root$path"; elif [ -e "$path" ]; then
               dirs="$dirs $root${path%/*}" files="$files $path"; fi ;;
    esac
done
# shellcheck disable=SC2086
mkdir "$root/var"  # /tmp first: a software path under /tmp (a home there) makes it too, with mode 0755
mkdir -m 1777 "$root/tmp" "$root/var/tmp"
mkdir -p "$root/proc" "$root/sys" "$root/dev/shm" "$root/run" "$root/etc" "$root/root" "$root/mnt/azureml" \
    "$root/mnt/amlemu/cache" $dirs
# shellcheck disable=SC2086
[ -z "$links" ] || cp -P $links "$root/"
for path in $files; do : >"$root$path"; done
# The node's mounts go into a table that one `mount -a` carries out, in its order: a mount(8)
# process per mount cost ~1.4 ms each, ~25 ms of every launch on every node. A line the table
# cannot hold as it is (a path with a space, tab, backslash or #) is mounted at once, after the
# lines before it.
table="$root/.amlemu-mounts"
: >"$table"
queue() {  # OPTIONS SOURCE TARGET [TYPE]
    case "$2$3" in
        *[[:space:]\\#]*) mount -a -T "$table"; : >"$table"; mount -t "${4:-none}" -o "$1" "$2" "$3"; return ;;
    esac
    printf '%s %s %s %s 0 0\n' "$2" "$3" "${4:-none}" "$1" >>"$table"
}
for dir in bin sbin lib lib32 lib64 libx32; do
    [ -L "/$dir" ] || { [ -d "/$dir" ] && queue bind,ro "/$dir" "$root/$dir"; } || true
done
for path in "$@"; do
    [ -e "$path" ] && queue bind,ro "$path" "$root$path"
done

for dev in null zero full random urandom tty /dev/nvidia*; do
    dev=/dev/${dev#/dev/}
    [ -e "$dev" ] || continue
    if [ -d "$dev" ]; then mkdir -p "$root$dev"; else : >"$root$dev"; fi  # /dev/nvidia-caps is a folder
    queue bind "$dev" "$root$dev"
done
queue "mode=1777,size=$shm" amlemu-shm "$root/dev/shm" tmpfs  # resources.shm_size
queue defaults proc "$root/proc" proc
queue rbind "$disk" "$root/mnt/azureml"  # recursive: the data runtime's mounts in it (read-only themselves)
queue bind,ro "$cache" "$root/mnt/amlemu/cache"
queue rbind,ro /sys "$root/sys"  # read-only at its top, as a docker node's
mount -a -T "$table"
rm "$table"
# /dev's links to this process's descriptors: this machine's own copied in one process where it has them.
if [ -L /dev/fd ] && [ -L /dev/stdin ] && [ -L /dev/stdout ] && [ -L /dev/stderr ]; then
    cp -P /dev/fd /dev/stdin /dev/stdout /dev/stderr "$root/dev/"
else
    ln -s /proc/self/fd "$root/dev/fd"
    ln -s /proc/self/fd/0 "$root/dev/stdin"
    ln -s /proc/self/fd/1 "$root/dev/stdout"
    ln -s /proc/self/fd/2 "$root/dev/stderr"
fi

printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\n' >"$root/etc/group"
# amlemu-service.blob.internal: the run's service link on this machine (backends/base.py SERVICE_HOST).
printf '127.0.0.1 localhost %s amlemu-service.blob.internal\n' "$host" >"$root/etc/hosts"
printf '%s\n' "$host" >"$root/etc/hostname"

hostname "$host" 2>/dev/null || printf '%s' "$host" >/proc/sys/kernel/hostname  # no hostname(1) on some images

exec /usr/bin/env -i "$chroot" "$root" \
    "$setpriv" --bounding-set=-all --inh-caps=-all --no-new-privs -- \
    "$tini" -- /bin/sh -c '. "$1" && exec /bin/sh -c "$2"' amlemu-node "$envfile" "$command"
