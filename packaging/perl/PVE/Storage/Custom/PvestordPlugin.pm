package PVE::Storage::Custom::PvestordPlugin;

# pvestord's storage plugin: qcow2 volumes on thick, shared LVM whose LVs start
# small and are grown by the pvestord daemon as the guest writes.
#
# A subclass of Proxmox's LVM plugin with its own section type ('pvestord'),
# so that Proxmox itself parses, keeps and writes back the thin options. The
# Perl here only maps Proxmox's method calls onto 'pvestord plugin' (JSON on
# stdin and stdout, see pvestord/features/plugin.py), which decides every size; what it
# answers is carried out with Proxmox's own helpers, under the storage lock
# Proxmox's callers hold or that is taken here as LVMPlugin does. That lock is
# the lock of every storage on the VG (cluster_lock_storage below), and none is
# taken on a VG pvestord has marked unhealthy on this node.
#
# Every method not overridden here is LVMPlugin's: size information, rename,
# export and import; so is the resize of a raw disk an 'lvm:' storage left.
# Listing and free are LVMPlugin's with templates and linked clones added
# (create_base and clone_image below, which LVMPlugin refuses).
# volume_snapshot_info is LVMPlugin's too, with one addition: called by
# qemu-server's online snapshot delete, it grows the LV the block job will
# write into before the job starts. Volume activation and deactivation are
# LVMPlugin's, with one addition: a copy target (made thick for a copy, or
# grown for a snapshot delete's merge) is reduced once its copy is over
# (reduce_copy_target below).

use strict;
use warnings;

use File::Basename qw(basename);
use JSON;
use List::Util qw(max);
use POSIX qw();
use Time::HiRes qw();

use PVE::Tools qw(run_command);
use PVE::Storage::Common;
use PVE::Storage::Plugin;
use PVE::Storage::LVMPlugin;

use base qw(PVE::Storage::LVMPlugin);

# The storage API this plugin is written against: pve-storage's ApiChangeLog
# version 15 ('$snapname' in volume_resize(), 'virtual-size' in
# volume_snapshot_info(), both used below).
sub api {
    return 15;
}

sub type {
    return 'pvestord';
}

sub plugindata {
    return {
        content => [{ images => 1 }, { images => 1 }],
        format => [{ qcow2 => 1 }, 'qcow2'],
        'sensitive-properties' => {},
    };
}

# Our options, every name with 'pvestord-' in front. Proxmox's storage plugins
# share one namespace of properties, and PVE::SectionConfig dies on a property
# two plugins declare ("duplicate property"), which stops PVE::Storage from
# loading in every Proxmox daemon. Plain names such as 'chunksize' are what
# Proxmox's own LVM plugin would declare for thin LVM of its own; prefixed ones
# cannot collide.
my $PROPERTIES = {
    'pvestord-chunksize' => {
        description => "pvestord: how much a thin LV grows at a time.",
        type => 'string',
        format => 'disk-size',
    },
    'pvestord-chunk-percentage' => {
        description => "pvestord: the share of a chunk still free when the LV is grown"
            . " (between 0 and 1).",
        type => 'number',
        minimum => 0,
        maximum => 1,
    },
    'pvestord-initial-size' => {
        description => "pvestord: the LV size of a new disk or snapshot overlay.",
        type => 'string',
        format => 'disk-size',
    },
    'pvestord-thin-warn-free' => {
        description => "pvestord: warn once when the VG's free space falls below this"
            . " share (10%) or size (50G). Default 10%.",
        type => 'string',
        pattern => '\d+(?:\.\d+)?(?:%|[KMGT]?)',
    },
    'pvestord-thin-critical-free' => {
        description => "pvestord: refuse new thin volumes below this free share or size;"
            . " running VMs keep growing. Default 5%.",
        type => 'string',
        pattern => '\d+(?:\.\d+)?(?:%|[KMGT]?)',
    },
    'pvestord-max-overcommit' => {
        description => "pvestord: refuse new thin volumes past this ratio of committed"
            . " maxima to the VG size. Default: no cap.",
        type => 'number',
        minimum => 0,
    },
    'pvestord-thin-reserve' => {
        description => "pvestord: free space an extension of a running VM never takes,"
            . " kept to let a VM paused on ENOSPC run again. Default: one chunk.",
        type => 'string',
        format => 'disk-size',
    },
};

# The names of our options before the prefix: sections written with them must
# keep their values, or Proxmox would drop them on its next write of
# storage.cfg. pvestord reads them as the prefixed ones (the prefixed name wins).
my %FORMER_NAMES = map { (s/^pvestord-//r) => $_ } keys $PROPERTIES->%*;

# Whether a former name of ours is declared by another registered plugin, or
# by the base (the properties every storage has). Then it is not declared here
# again (that is the duplicate SectionConfig dies on), only used in options():
# sections keep it under that plugin's declaration.
my sub declared_elsewhere {
    my ($name) = @_;

    my $pdata = PVE::Storage::Plugin->private();
    # While SectionConfig's init() runs, its propertyList is being filled with
    # every plugin's properties, ours among them; the base ones are kept apart.
    my $base = $pdata->{'base-property-list'} // {};
    return 1 if $base->{$name};
    for my $type (keys(($pdata->{plugins} // {})->%*)) {
        next if $type eq type();
        return 1 if $pdata->{plugins}->{$type}->properties()->{$name};
    }
    return 0;
}

sub properties {
    my $properties = { map { $_ => { $PROPERTIES->{$_}->%* } } keys $PROPERTIES->%* };
    for my $former (keys %FORMER_NAMES) {
        next if declared_elsewhere($former);
        my $current = $FORMER_NAMES{$former};
        $properties->{$former} = {
            $PROPERTIES->{$current}->%*,
            description => "Deprecated, read as '$current': use that instead.",
        };
    }
    return $properties;
}

sub options {
    my $options = { PVE::Storage::LVMPlugin->options()->%* };
    # Thin volumes are qcow2 images, which LVM storages hold only as volume
    # chains. Required, and supplied when missing (check_config below).
    $options->{'snapshot-as-volume-chain'} = { fixed => 1 };
    $options->{$_} = { optional => 1 } for keys $PROPERTIES->%*, keys %FORMER_NAMES;
    return $options;
}

sub get_formats {
    return { default => 'qcow2', valid => { qcow2 => 1 } };
}

# A section without 'snapshot-as-volume-chain' is most often an 'lvm:' one
# whose header was changed to 'pvestord:' (the lvm type's default is off, so
# its sections often lack the line). SectionConfig refuses a section missing a
# required option by leaving it empty: the storage vanishes (every read warns
# "missing value for required option" on stderr, 'storage ... does not exist'
# for its disks), and every write of storage.cfg, any storage edit in the GUI,
# the API or pvesm, dies "unknown section type ''". The option has one value
# for this type, so a section without it gets it here, where Proxmox parses
# every section (parse_config calls this with $create set), as the value
# every reader of the section (LVMPlugin's own code among them) then sees;
# Proxmox writes it out with the section next time. A storage added without
# it (pvesm add, the API, whose schema cannot require it: the option is the
# other types' too) gets it the same way; added with it off, on_add_hook
# refuses it; a section with it off is refused when the storage is activated,
# below. Other types' sections never come through here.
sub check_config {
    my ($class, $sectionId, $config, $create, $skipSchemaCheck) = @_;

    $config = { $config->%*, 'snapshot-as-volume-chain' => 1 }
        if $create && !defined($config->{'snapshot-as-volume-chain'});
    return $class->SUPER::check_config($sectionId, $config, $create, $skipSchemaCheck);
}

my sub volume_chain_needed {
    my ($storeid) = @_;
    return "storage '$storeid': type 'pvestord' needs 'snapshot-as-volume-chain 1' (its disks"
        . " are qcow2 volume chains)";
}

sub on_add_hook {
    my ($class, $storeid, $scfg, %param) = @_;

    die volume_chain_needed($storeid) . "\n" if !$scfg->{'snapshot-as-volume-chain'};
    return $class->SUPER::on_add_hook($storeid, $scfg, %param);
}

# 'snapshot-as-volume-chain 0' written by hand: the section is kept (dying in
# check_config would empty it, as a missing option did), but nothing is
# done on the storage, where LVMPlugin's code would see no volume chains (no
# snapshots listed, none freed with their disk). PVE::Storage activates a
# storage before allocating on it, freeing on it or activating its volumes,
# so each such task fails with this message; the storage status
# (PVE::Storage::storage_info) shows it inactive, as any storage that fails
# to activate.
sub activate_storage {
    my ($class, $storeid, $scfg, $cache) = @_;

    # The option is fixed: 'pvesm set' and the GUI cannot change it.
    die volume_chain_needed($storeid) . ": set it in /etc/pve/storage.cfg\n"
        if !$scfg->{'snapshot-as-volume-chain'};
    return $class->SUPER::activate_storage($storeid, $scfg, $cache);
}

# The pvestord root runs here, inside pvedaemon: a fixed path, never one the
# environment could choose. (The tests point it at their checkout through the
# package variable.)
our $PVESTORD = '/usr/bin/pvestord';

# How long pvestord may take to answer when no lock alarm bounds it: above its
# own budget then (30 s, UNTIMED_LOCK_BUDGET in pvestord/features/plugin.py).
my $UNTIMED_ASK_TIMEOUT = 60;

# One decision of pvestord's: the request with this storage's settings in, the answer out.
#
# The question which locks to take comes before any lock and is bounded by a
# timeout below. Every other caller holds the storage lock, and cfs_lock runs
# the locked code under an alarm (60 s) that aborts it well before pmxcfs lets another node take the
# lock (120 s). run_command with a 'timeout' would put that alarm aside while
# pvestord runs and re-arm it afterwards with the time it had left before, so
# no timeout is passed: the caller's alarm bounds pvestord. pvestord is told
# what is left of it and keeps to half of that, leaving the rest for the LVM
# command that carries its answer out. run_command without a timeout ends with
# alarm(0), so the caller's alarm is re-armed here with what it still has left.
my sub ask {
    my ($scfg, $storeid, $request) = @_;

    # Under either name: pvestord decides which one counts.
    my %options = map { defined($scfg->{$_}) ? ($_ => "$scfg->{$_}") : () }
        keys $PROPERTIES->%*, keys %FORMER_NAMES;
    $request->{storage} = {
        storeid => $storeid,
        vgname => $scfg->{vgname},
        shared => $scfg->{shared} ? JSON::true : JSON::false,
        options => \%options,
    };
    # Reading an alarm means stopping it; it is re-armed at once.
    my $alarm_left = Time::HiRes::alarm(0);
    Time::HiRes::alarm($alarm_left) if $alarm_left;
    my $asked_at = Time::HiRes::time();
    $request->{lock_seconds_left} = $alarm_left ? $alarm_left + 0 : undef;
    my $output = '';
    run_command(
        [$PVESTORD, 'plugin'],
        input => encode_json($request),
        outfunc => sub { $output .= shift },
        errmsg => "pvestord plugin $request->{op}",
        # With no alarm to put aside (before the locks are taken, or under the
        # flock of a storage that is not shared), a timeout is what bounds it.
        ($alarm_left ? () : (timeout => $UNTIMED_ASK_TIMEOUT)),
    );
    # On failure the error goes up to the lock, which ends it and its alarm.
    if ($alarm_left) {
        my $still_left = $alarm_left - (Time::HiRes::time() - $asked_at);
        # Spent to the last moment without firing: let it fire now.
        Time::HiRes::alarm($still_left > 0 ? $still_left : 0.001);
    }
    return decode_json($output);
}

# Set while this process runs code under the storage locks (taken by any
# caller: they all lock through cluster_lock_storage below). A copy target's
# reduction takes those locks itself, in another process: asked for under
# them, it would wait for this one until its lock wait timed out.
our $HOLDING_LOCKS = 0;

# Set while an offline snapshot delete merges one LV of a chain into another:
# LVMPlugin's delete activates the volume first, and the LV grown and tagged
# for the merge (make_room_for_delete) must keep its room until the merge has
# written into it. It is reduced right after (volume_snapshot_delete).
our $MERGING = 0;

# Proxmox locks 'storage-<storeid>' around a change of a storage's LVM
# metadata, never the VG: an 'lvm:' and a 'pvestord:' storage on one VG would
# take two different locks, and Proxmox's lvcreate on the one could write the
# VG's metadata at the moment our lvcreate on the other does (one update lost,
# extents given twice). So every lock taken on this storage, by Proxmox's
# callers (vdisk_alloc, vdisk_free, rename, LVMPlugin's snapshot and free
# paths) and by the methods below, is the lock of every storage on the VG,
# each taken as Proxmox takes it for that storage, in the order pvestord's
# daemon takes them (two holders taking them in one order cannot deadlock).
# Which ones, in which order, and whether this node may change the VG at all
# (its unhealthy mark): pvestord decides ('locks', pvestord/features/pluginlocks.py),
# the daemon's rule; here they are only taken.
#
# Nested, each cfs_lock suspends the one around it and gives the code inside
# its own alarm(60): the innermost alarm bounds the code, and the outer locks
# are held that long plus the waits for the inner ones. The waits share one
# budget, $timeout (10 s, what a caller allows for its one lock), so the first
# lock is held at most some 70 s, inside pmxcfs's 120 s.
sub cluster_lock_storage {
    my ($class, $storeid, $shared, $timeout, $func, @param) = @_;

    my $cfg = PVE::Storage::config();
    my $scfg = $cfg->{ids}->{$storeid} // die "storage '$storeid' does not exist\n";
    my $ask_locks = sub {
        my @storages;
        for my $id (sort keys $cfg->{ids}->%*) {
            my $section = $cfg->{ids}->{$id};
            push @storages, {
                storeid => $id,
                type => $section->{type},
                map { defined($section->{$_}) ? ($_ => "$section->{$_}") : () }
                    qw(vgname shared disable),
            };
        }
        # Refused (an error naming the mark) when the VG is marked on this node.
        return ask({ $scfg->%*, shared => $shared }, $storeid,
            { op => 'locks', storages => \@storages });
    };
    my $plan = $ask_locks->();
    my $deadline = Time::HiRes::time() + ($timeout || 10);
    my $locked = sub {
        # The daemon may have marked the VG while we waited for the locks:
        # asked again, pvestord refuses with the mark's reason.
        $ask_locks->() if -e $plan->{health_mark};
        local $HOLDING_LOCKS = 1;
        return $func->(@param);
    };
    for my $lock (reverse $plan->{locks}->@*) {
        my $inner = $locked;
        $locked = sub {
            # cfs_lock and lock_file take whole seconds, at least one.
            my $wait = max(1, POSIX::ceil($deadline - Time::HiRes::time()));
            return $class->SUPER::cluster_lock_storage(
                $lock->{storeid}, $lock->{shared}, $wait, $inner,
            );
        };
    }
    return $locked->();
}

# The tag of a copy target: an LV made thick (at its image's maximum) because
# qemu-server copies a whole disk into it with nobody to grow it ('alloc' in
# pvestord/features/plugin.py; COPY_TAG in pvestord/policy/capacity.py).
my $COPY_TAG = 'pvestord-copy';

# How long a copy target's reduction may take: 'qemu-img check' of the image
# (it reads every table), the wait for the storage locks (10 s) and lvreduce.
my $REDUCE_TIMEOUT = 300;

# The LVs of the chain of the disk LV $top that are copy targets, $top first:
# the disk's own LV and its snapshot LVs, the LVs LVMPlugin activates and
# deactivates together (by these names, get_activate_volume_target_opts). A
# snapshot LV is one when a snapshot delete merged into it (make_room_for_delete).
# $cache: the hash PVE::Storage::(de)activate_volumes hands each volume of one
# call, so that activating a VM's disks lists their VG once, not once per disk.
my sub copy_targets {
    my ($scfg, $top, $cache) = @_;

    my $vg = $scfg->{vgname};
    my $lvs = $cache
        ? ($cache->{pvestord_lvs}->{$vg} //= PVE::Storage::LVMPlugin::lvm_list_volumes($vg))
        : PVE::Storage::LVMPlugin::lvm_list_volumes($vg);
    my $stem = $top =~ s/\.qcow2$//r;
    my @snapshots = grep { /^snap_\Q$stem\E_.+\.qcow2$/ } sort keys(($lvs->{$vg} // {})->%*);
    my @chain = ($top, @snapshots);
    return grep {
        my $tags = $lvs->{$vg}->{$_}->{tags} // '';
        scalar(grep { $_ eq $COPY_TAG } split(/,/, $tags));
    } @chain;
}

# A copy target is thick while qemu-server copies into it and thin as soon as
# the copy is over: 'pvestord volume reduce-copy' reduces its LV to its data
# plus a chunk, as 'pvestord volume shrink' does, and drops the tag
# (pvestord/features/volumes/copies.py). qemu-server deactivates the volume
# when the copy is over (every offline copy ends with deactivate_volumes; a
# mirror's or migration's target is deactivated when its VM stops), so it is
# asked before LVMPlugin deactivates it; a full clone on the same node never
# deactivates its new volume, so it is asked too after LVMPlugin activates
# one ($on_activation), where it reduces only an image that already holds
# data: clone_disk activates the new volume, still empty, right before it
# copies into it. The LV a running VM's snapshot delete merged into is one
# too, the top or a snapshot LV of the chain, reduced at the VM's stop; an
# offline delete has it reduced at once (volume_snapshot_delete). Each tagged
# LV of the chain is asked for. Proxmox calls both without the storage lock:
# pvestord takes it, for the lvreduce alone. A refusal (the LV in use, the VM
# running here, the image not clean, the LV changed meanwhile) changes
# nothing and is a warning: the volume works as it is, and the next
# activation or deactivation asks again. Never asked under the storage locks
# (our own activations while making a volume, snapshots): pvestord would wait
# for them.
my sub reduce_copy_target {
    my ($class, $storeid, $scfg, $volname, $snapname, $cache, $on_activation) = @_;

    return if defined($snapname) || $HOLDING_LOCKS || $MERGING;
    return if ($class->parse_volname($volname))[6] ne 'qcow2';
    # A base or a linked clone is never a copy target.
    return if $volname =~ m/^base-/;
    my @targets = eval { copy_targets($scfg, basename($class->path($scfg, $volname, $storeid)),
        $cache) };
    warn "copy targets of '$storeid:$volname' not listed: $@" if $@;
    for my $lv (@targets) {
        my $volid = "$storeid:$lv";
        my $errors = '';
        eval {
            run_command(
                [
                    $PVESTORD, 'volume', 'reduce-copy',
                    ($on_activation ? ('--on-activation') : ()), $volid,
                ],
                timeout => $REDUCE_TIMEOUT,
                # Its one line, for the task log; stdout may be an API answer's.
                outfunc => sub { print STDERR "$_[0]\n" },
                errfunc => sub { $errors .= "$_[0]\n" },
            );
        };
        if (my $err = $@) {
            chomp(my $why = $errors ne '' ? $errors : $err);
            warn "copy target '$volid' keeps its size for now: $why\n"
                . "It is tried again at its next activation and deactivation; or run"
                . " 'pvestord volume shrink $storeid:$volname' once its VM is stopped.\n";
        }
    }
    return;
}

# --- Templates and linked clones -------------------------------------------
#
# 'qm template' makes a disk a base: its LV renamed base-<vmid>-disk-<n>.qcow2
# and made read-only (create_base below). A linked clone is an overlay LV of
# its own whose backing file is the base's LV, tagged with the base's name
# ($PARENT_TAG, PARENT_TAG_PREFIX in pvestord/policy/templates.py): the VG is
# shared, so every node reads which LVs use a base, and a base one of them
# names is never freed (free_image, under the storage lock). Proxmox knows a
# clone as '<base>/<own LV>' (parse_volname), the name RBD and the directory
# plugins give linked clones, from which PVE::Storage's vdisk_free reads the
# base (volume_is_base_and_used) and refuses to free it too.

my $PARENT_TAG = 'pvestord-parent-';

# The base's LV a linked clone's LV uses, from its tags (lvm_list_volumes'
# entry $info); undef for any other LV.
my sub parent_of {
    my ($info) = @_;
    for my $tag (split(/,/, ($info // {})->{tags} // '')) {
        return $1 if $tag =~ m/^\Q$PARENT_TAG\E(base-\d+-[A-Za-z0-9_.\-]*\.qcow2)$/;
    }
    return undef;
}

# The linked clones of $base among the VG's LVs $lvs (lvm_list_volumes' entries
# of the VG). An LV saferemove set aside for zeroing ('del-...') reads nothing.
my sub clones_of {
    my ($lvs, $base) = @_;
    return sort grep {
        !/^del-/ && (parent_of($lvs->{$_}) // '') eq $base
    } keys %$lvs;
}

# $base and the bases it is itself a linked clone of (a template made of a
# linked clone), nearest first.
my sub bases_from {
    my ($lvs, $base, $vg) = @_;
    my @bases;
    my %seen;
    while (defined($base)) {
        die "base '$vg/$base' of a linked clone does not exist\n" if !$lvs->{$base};
        die "bases of '$vg/$bases[0]' name each other\n" if $seen{$base}++;
        push @bases, $base;
        $base = parent_of($lvs->{$base});
    }
    return @bases;
}

my sub list_vg {
    my ($scfg) = @_;
    my $vg = $scfg->{vgname};
    return PVE::Storage::LVMPlugin::lvm_list_volumes($vg)->{$vg} // {};
}

# A base is activated with every clone of it that is activated on this node,
# and deactivated when the last of them is: one node-local lock orders the
# (de)activations of bases on a VG, so that a clone activated here meanwhile
# never finds its base gone. (The storage lock is not taken: Proxmox
# activates and deactivates volumes without it.)
our $BASES_LOCK_DIR = '/run/lock';
my $BASES_LOCK_TIMEOUT = 60;

my sub with_bases_lock {
    my ($scfg, $code) = @_;
    my $file = "$BASES_LOCK_DIR/pvestord-bases-$scfg->{vgname}.lck";
    my $result = PVE::Tools::lock_file($file, $BASES_LOCK_TIMEOUT, $code);
    die $@ if $@;
    return $result;
}

# The base $base and the bases below it, active on this node: shared (every
# node running a clone of it has it active) and, as create_base left them,
# read-only.
my sub activate_bases {
    my ($scfg, $base) = @_;
    my $vg = $scfg->{vgname};
    my @paths = map {"$vg/$_"} bases_from(list_vg($scfg), $base, $vg);
    run_command(
        ['/sbin/lvchange', '-asy', @paths],
        errmsg => "can't activate base '$paths[0]'",
    );
}

# Deactivate $base on this node, and the bases below it, unless an LV active
# here still uses it: another clone (a running VM, or one being started),
# or a base made of a clone of it. One still open (a copy reading it) stays
# active, quietly: the next deactivation tries again.
my sub release_bases {
    my ($scfg, $base) = @_;
    my $vg = $scfg->{vgname};
    my $lvs = list_vg($scfg);
    for my $name (bases_from($lvs, $base, $vg)) {
        my @users = grep { ($lvs->{$_}->{lv_state} // '') eq 'a' } clones_of($lvs, $name);
        return if @users;
        next if ($lvs->{$name}->{lv_state} // '') ne 'a';
        my $errors = '';
        eval {
            run_command(
                ['/sbin/lvchange', '-aln', "$vg/$name"],
                errfunc => sub { $errors .= "$_[0]\n" },
            );
        };
        if (my $err = $@) {
            return if $errors =~ m/in use|open/i;
            die "can't deactivate base '$vg/$name': " . ($errors || $err);
        }
        $lvs->{$name}->{lv_state} = '-';
    }
}

# (base, whether $volname is a base) of a volume name, for the methods below:
# a linked clone's base, or the volume itself when it is a base; undef for a
# volume that is neither.
my sub base_of_volume {
    my ($class, $volname) = @_;
    my ($name, $basename, $isBase) = ($class->parse_volname($volname))[1, 3, 5];
    return ($name, 1) if $isBase;
    return ($basename, 0);
}

sub activate_volume {
    my ($class, $storeid, $scfg, $volname, $snapname, $cache) = @_;

    my ($base, $is_base) = base_of_volume($class, $volname);
    if (!defined($base)) {
        # Every argument on to LVMPlugin (PVE::Storage passes hints after $cache).
        $class->SUPER::activate_volume(@_[1 .. $#_]);
        reduce_copy_target($class, $storeid, $scfg, $volname, $snapname, $cache, 1);
        return;
    }
    die "a base has no snapshots: '$volname', snapshot '$snapname'\n"
        if $is_base && defined($snapname);
    my @args = @_[1 .. $#_];
    with_bases_lock(
        $scfg,
        sub {
            activate_bases($scfg, $base);
            $class->SUPER::activate_volume(@args) if !$is_base;
        },
    );
    return;
}

sub deactivate_volume {
    my ($class, $storeid, $scfg, $volname, $snapname, $cache) = @_;

    my ($base, $is_base) = base_of_volume($class, $volname);
    if (!defined($base)) {
        reduce_copy_target($class, $storeid, $scfg, $volname, $snapname, $cache, 0);
        return $class->SUPER::deactivate_volume(@_[1 .. $#_]);
    }
    my @args = @_[1 .. $#_];
    with_bases_lock(
        $scfg,
        sub {
            $class->SUPER::deactivate_volume(@args) if !$is_base;
            release_bases($scfg, $base);
        },
    );
    return;
}

# A linked clone ('<base>/<LV>') and a base are named as LVMPlugin does not
# know them; every other name is LVMPlugin's. A base's name keeps its disk's
# number, so LVMPlugin's find_free_diskname never hands it out again.
sub parse_volname {
    my ($class, $volname) = @_;

    if ($volname =~ m!^(base-(\d+)-[^/\s]+\.qcow2)/((vm|base)-(\d+)-[^/\s]+\.qcow2)$!) {
        my ($basename, $basevmid, $name, $kind, $vmid) = ($1, $2, $3, $4, $5);
        PVE::Storage::Plugin::parse_lvm_name($_) for $basename, $name;
        return ('images', $name, $vmid, $basename, $basevmid, $kind eq 'base' ? 1 : undef, 'qcow2');
    }
    if ($volname =~ m!^(base-(\d+)-\S+\.qcow2)$!) {
        PVE::Storage::Plugin::parse_lvm_name($1);
        return ('images', $1, $2, undef, undef, 1, 'qcow2');
    }
    return $class->SUPER::parse_volname($volname);
}

# Templates of qcow2 disks, linked clones of bases (never of a snapshot). A
# linked clone's snapshots are not offered yet (its chain would need the base
# below its oldest snapshot), nor is renaming one (its name holds its base's).
sub volume_has_feature {
    my ($class, $scfg, $feature, $storeid, $volname, $snapname, $running, $opts) = @_;

    my ($basename, $isBase, $format) = ($class->parse_volname($volname))[3, 5, 6];
    if ($feature eq 'template') {
        return !$snapname && !$isBase && $format eq 'qcow2' ? 1 : undef;
    }
    if ($feature eq 'clone') {
        return !$snapname && $isBase ? 1 : undef;
    }
    return undef
        if ($isBase || defined($basename)) && ($feature eq 'snapshot' || $feature eq 'rename');
    return $class->SUPER::volume_has_feature(@_[1 .. $#_]);
}

# LVMPlugin lists 'vm-*' LVs only, by their LV names: a linked clone is listed
# under its volume name, with its base as 'parent' (the volume id, as
# Proxmox's content listing describes it), and the bases are added.
sub list_images {
    my ($class, $storeid, $scfg, $vmid, $vollist, $cache) = @_;

    $cache //= {};
    $cache->{lvs} = PVE::Storage::LVMPlugin::lvm_list_volumes() if !$cache->{lvs};
    my $lvs = $cache->{lvs}->{ $scfg->{vgname} } // {};
    # The volume list is matched below, against the names given here.
    my $listed = $class->SUPER::list_images($storeid, $scfg, $vollist ? undef : $vmid, undef,
        $cache);
    my @images;
    for my $entry (@$listed) {
        my (undef, $lv) = PVE::Storage::Plugin::parse_volume_id($entry->{volid});
        if (defined(my $base = parent_of($lvs->{$lv}))) {
            $entry->{volid} = "$storeid:$base/$lv";
            $entry->{parent} = "$storeid:$base";
        }
        push @images, $entry;
    }
    for my $lv (sort keys %$lvs) {
        next if $lv !~ m/^base-(\d+)-\S+\.qcow2$/;
        my $owner = $1;
        next if !$vollist && defined($vmid) && $owner ne $vmid;
        my $info = $lvs->{$lv};
        next if $scfg->{tagged_only} && ($info->{tags} // '') !~ m/(?:^|,)pve-vm-\d+(?:,|$)/;
        next if $info->{lv_type} !~ m/^[-mMrR]$/;
        my $base = parent_of($info);
        my $volname = defined($base) ? "$base/$lv" : $lv;
        my $entry =
            { volid => "$storeid:$volname", format => 'qcow2', vmid => $owner, ctime => $info->{ctime} };
        $entry->{parent} = "$storeid:$base" if defined($base);
        my $size = $info->{lv_state} eq 'a'
            ? $class->volume_size_info($scfg, $storeid, $volname)
            : undef;
        if (defined($size)) {
            $entry->{size} = $size;
        } else {
            $entry->{'approximate-size'} = $info->{lv_size};
        }
        push @images, $entry;
    }
    if ($vollist) {
        my %wanted = map { $_ => 1 } @$vollist;
        @images = grep { $wanted{ $_->{volid} } } @images;
    }
    return \@images;
}

# LVMPlugin's free, on the LV. A base is refused while an LV of the VG, on
# any node, is a linked clone of it: PVE::Storage's vdisk_free checks the
# volume names first; this reads the tags under the same storage lock (and
# covers every other caller). A base is read-only: saferemove's zeroing needs
# it writable again. A linked clone's chain is read with its base active.
sub free_image {
    my ($class, $storeid, $scfg, $volname, $isBase, $format) = @_;

    my ($name, $basename) = ($class->parse_volname($volname))[1, 3];
    if ($isBase) {
        my @clones = clones_of(list_vg($scfg), $name);
        die "base volume '$volname' is still in use by linked clones (@clones)\n" if @clones;
        run_command(
            ['/sbin/lvchange', '--permission', 'rw', "$scfg->{vgname}/$name"],
            errmsg => "can't make base '$scfg->{vgname}/$name' writable to zero it",
        ) if $scfg->{saferemove};
    } elsif (defined($basename)) {
        $class->activate_volume($storeid, $scfg, $volname);
    }
    return $class->SUPER::free_image($storeid, $scfg, $name, $isBase, $format);
}

# Under the storage lock, ask pvestord how large the LV at $path must be and
# grow it that far if it is smaller. The LV's recorded maximum (its
# 'pvestord-max-<bytes>' tag, which every node's capacity figures read) is
# brought to the image's new one first: if the lvextend then fails, the tag
# over-counts until the next change, which the guards prefer to under-counting.
my sub grow_as_asked {
    my ($class, $scfg, $storeid, $path, $request) = @_;

    $class->cluster_lock_storage(
        $storeid,
        $scfg->{shared},
        undef,
        sub {
            my $plan = ask($scfg, $storeid, $request);
            my @retag = (
                (map { ('--deltag', $_) } ($plan->{deltags} // [])->@*),
                (map { ('--addtag', $_) } ($plan->{addtags} // [])->@*),
            );
            run_command(
                ['/sbin/lvchange', @retag, $path],
                errmsg => "error recording the maximum of '$path'",
            ) if @retag;
            return if !$plan->{extend};
            run_command(
                ['/sbin/lvextend', '--size', "$plan->{lv_size}b", $path],
                errmsg => "error growing volume '$path'",
            );
        },
    );
}

# What pvestord answers for a new volume Proxmox asked for as $name in $fmt,
# of $virtual_size bytes, an overlay when $backing is true (on a snapshot or,
# with $parent, on the base $parent: a linked clone): the LV to create (name,
# size, tags) and what goes on it. Asking changes nothing: every refusal of
# pvestord's (its capacity guards, a name or format it does not hold, an
# answer too late) comes before any change.
# $replaces: the volume replaces the LV of its name (a rollback's new top).
my sub plan_volume {
    my ($class, $storeid, $scfg, $vmid, $fmt, $name, $virtual_size, $backing, $replaces, $parent)
        = @_;

    my @callers;
    for (my $depth = 1; my @frame = caller($depth); $depth++) {
        push @callers, $frame[3];
    }
    return ask(
        $scfg,
        $storeid,
        {
            op => 'alloc',
            vmid => int($vmid),
            format => $fmt,
            name => $name,
            virtual_size => int($virtual_size),
            backing => $backing ? JSON::true : JSON::false,
            callers => \@callers,
            ($replaces ? (replaces => $name) : ()),
            (defined($parent) ? (parent => $parent) : ()),
        },
    );
}

# Carry out $plan (plan_volume's answer): the LV, sized and tagged as it says;
# a qcow2 image on it without preallocation, of $virtual_size bytes or, an
# overlay, on top of the image $backing names (laid out as Proxmox lays
# overlays out). A raw volume (a VM's RAM state) is the LV alone, as
# LVMPlugin makes it. On a failure the LV made is removed again. Returns the
# volume name made.
my sub make_volume {
    my ($class, $storeid, $scfg, $plan, $virtual_size, $backing) = @_;

    my $vg = $scfg->{vgname};
    my $name = $plan->{name};
    PVE::Storage::LVMPlugin::lvcreate($vg, $name, "$plan->{lv_size}b", $plan->{tags});
    return $name if $plan->{format} ne 'qcow2';
    eval {
        $class->activate_volume($storeid, $scfg, $name);
        my $path = $class->path($scfg, $name, $storeid);
        my $options = { preallocation => $plan->{preallocation} };
        if (defined($backing)) {
            PVE::Storage::Common::qemu_img_create_qcow2_backed($path, $backing, 'qcow2', $options);
        } else {
            PVE::Storage::Common::qemu_img_create('qcow2', $virtual_size / 1024, $path, $options);
        }
    };
    if (my $err = $@) {
        # Nothing is on the LV yet: no need to zero it.
        eval { run_command(['/sbin/lvremove', '-f', "$vg/$name"]) };
        warn $@ if $@;
        die $err;
    }
    return $name;
}

my sub create_volume {
    my ($class, $storeid, $scfg, $vmid, $fmt, $name, $virtual_size, $backing) = @_;

    my $plan = plan_volume(
        $class, $storeid, $scfg, $vmid, $fmt, $name, $virtual_size, defined($backing),
    );
    return make_volume($class, $storeid, $scfg, $plan, $virtual_size, $backing);
}

# The backing file of an overlay on snapshot $snap of $volname: the snapshot
# LV's name, relative to the overlay's folder (/dev/<vg>), as Proxmox's LVM
# plugin writes it.
my sub snapshot_backing {
    my ($class, $storeid, $scfg, $volname, $snap) = @_;
    return basename($class->path($scfg, $volname, $storeid, $snap));
}

# A new top for $volname on top of its snapshot $snap, at the snapshot's
# virtual size: pvestord's plan for it and that size, nothing made yet.
# $replaces: it replaces the current top (a rollback), which pvestord's
# guards then count as removed.
my sub plan_top {
    my ($class, $storeid, $scfg, $volname, $snap, $replaces) = @_;

    my $vmid = ($class->parse_volname($volname))[2];
    my $snap_path = $class->path($scfg, $volname, $storeid, $snap);
    my $size = PVE::Storage::Plugin::file_size_info($snap_path, 5, 'qcow2');
    die "file_size_info on '$snap_path' failed\n" if !defined($size);
    my $plan = plan_volume(
        $class, $storeid, $scfg, $vmid, 'qcow2', $volname, $size, $snap, $replaces,
    );
    return ($plan, $size);
}

my sub create_top {
    my ($class, $storeid, $scfg, $volname, $snap) = @_;

    my ($plan, $size) = plan_top($class, $storeid, $scfg, $volname, $snap);
    make_volume(
        $class, $storeid, $scfg, $plan, $size,
        snapshot_backing($class, $storeid, $scfg, $volname, $snap),
    );
}

my sub assert_qcow2 {
    my ($class, $volname) = @_;
    my $format = ($class->parse_volname($volname))[6];
    die "storage type 'pvestord' holds qcow2 volumes only, not '$volname'\n"
        if $format ne 'qcow2';
}

# Disks are qcow2. pvestord also takes the two volumes Proxmox allocates by a
# fixed name (which names and formats: pvestord/policy/volumes.py, new_volume):
# a snapshot's or hibernation's RAM state, raw, and a backup's fleecing image,
# which it names with '.qcow2' (the name Proxmox gets back and uses).
sub alloc_image {
    my ($class, $storeid, $scfg, $vmid, $fmt, $name, $size) = @_;

    $name = $class->find_free_diskname($storeid, $scfg, $vmid, $fmt) if !$name;
    return create_volume($class, $storeid, $scfg, $vmid, $fmt, $name, $size * 1024, undef);
}

sub volume_snapshot {
    my ($class, $scfg, $storeid, $volname, $snap) = @_;

    assert_qcow2($class, $volname);
    die "storage type 'pvestord' has no snapshots of templates or linked clones yet,"
        . " not of '$volname'\n"
        if $volname =~ m/^base-/;
    return $class->cluster_lock_storage(
        $storeid,
        $scfg->{shared},
        undef,
        sub {
            $class->activate_volume($storeid, $scfg, $volname);
            $class->rename_snapshot($scfg, $storeid, $volname, 'current', $snap);
            eval { create_top($class, $storeid, $scfg, $volname, $snap) };
            if (my $err = $@) {
                eval { $class->rename_snapshot($scfg, $storeid, $volname, $snap, 'current') };
                warn $@ if $@;
                die $err;
            }
            return;
        },
    );
}

# The name the top of $volname has while a rollback replaces it: a volume
# name (free_image takes it), not one of the names that activate $volname's
# chain. One left by a rollback that did not finish (the node died in it) is
# listed as a raw volume of the VM: a new rollback refuses to run over it.
my sub replaced_top_name {
    my ($volname) = @_;
    return "$volname-rollback";
}

# A rollback completes or leaves the volume as it was. pvestord is asked for
# the new top first, with the old one in place: a refusal changes nothing.
# Its guards judge the VG as the rollback leaves it (the old top removed), as
# when the old top was removed first: a rollback that discards a top grown
# large is not refused for the room that top holds; LVM refuses the new top
# if the VG cannot hold both for the moment they coexist.
# The old top is then set aside by a rename, the new one made under the
# volume's name (its tags are the volume's), and only then is the old one
# freed; a failure in between removes the new top and renames the old one
# back. Freeing is Proxmox's own free_image: without saferemove the LV is
# removed here, with it renamed to 'del-...' and handed back as a worker
# that zeroes and removes it outside the storage lock: the top may have grown
# to hundreds of GiB, far more than cfs_lock's alarm allows for the zeroing.
my sub volume_snapshot_rollback_locked {
    my ($class, $scfg, $storeid, $volname, $snap) = @_;

    $class->activate_volume($storeid, $scfg, $volname);
    my ($plan, $size) = plan_top($class, $storeid, $scfg, $volname, $snap, 1);
    my $replaced = replaced_top_name($volname);
    # lvrename refuses, changing nothing, when $replaced is left from a rollback
    # that did not finish: that LV may be the only copy of a top.
    PVE::Storage::LVMPlugin::lvrename($scfg, $volname, $replaced);
    eval {
        make_volume(
            $class, $storeid, $scfg, $plan, $size,
            snapshot_backing($class, $storeid, $scfg, $volname, $snap),
        );
    };
    if (my $err = $@) {
        eval { PVE::Storage::LVMPlugin::lvrename($scfg, $replaced, $volname) };
        warn "rollback of '$volname' failed and its top was not put back,"
            . " it is '$scfg->{vgname}/$replaced': $@"
            if $@;
        die $err;
    }
    # The rollback is done, whatever happens to the old top now. 'raw': this
    # LV alone, never the snapshots its image is backed by.
    my $cleanup_worker = eval { $class->free_image($storeid, $scfg, $replaced, 0, 'raw') };
    warn "rolled back '$volname', but its former top '$scfg->{vgname}/$replaced'"
        . " was not freed: $@"
        if $@;
    return $cleanup_worker;
}

sub volume_snapshot_rollback {
    my ($class, $scfg, $storeid, $volname, $snap) = @_;

    assert_qcow2($class, $volname);
    my $cleanup_worker = $class->cluster_lock_storage(
        $storeid,
        $scfg->{shared},
        undef,
        sub { return volume_snapshot_rollback_locked($class, $scfg, $storeid, $volname, $snap) },
    );
    # Outside the lock: the worker takes it again to remove the LV, and in a
    # CLI (qm rollback) fork_worker waits for the worker to finish.
    if ($cleanup_worker) {
        PVE::RPCEnvironment::get()->fork_worker('imgdel', undef, undef, $cleanup_worker);
    }
    return;
}

sub volume_resize {
    my ($class, $scfg, $storeid, $volname, $size, $running, $snapname) = @_;

    # A raw disk is one an 'lvm:' storage held before it became a 'pvestord:'
    # one: thick, nothing of pvestord's. It keeps the resize it had there,
    # LVMPlugin's (the LV extended to the new size), so converting a storage
    # takes nothing away from the disks already on it.
    my $format = ($class->parse_volname($volname))[6];
    return $class->SUPER::volume_resize($scfg, $storeid, $volname, $size, $running, $snapname)
        if $format eq 'raw';
    my $path = $class->path($scfg, $volname, $storeid, $snapname);
    grow_as_asked(
        $class, $scfg, $storeid, $path,
        { op => 'resize', lv => basename($path), virtual_size => int($size) },
    );
    # A running VM's image is grown by QEMU (block_resize), like LVMPlugin.
    PVE::Storage::Common::qemu_img_resize($path, 'qcow2', $size, 'off', 10) if !$running;
    return 1;
}

# Before a snapshot delete writes one LV of the chain into another, grow the LV
# written to by what pvestord answers (the source's data plus a chunk, capped at
# the image's maximum): nobody grows it while the copy runs. Deleting the first
# snapshot writes its child into it; a later one is written into its child.
my sub make_room_for_delete {
    my ($class, $scfg, $storeid, $snapshots, $snap, $running) = @_;

    my $deleted = $snapshots->{$snap};
    my $child = $deleted && $deleted->{child} ? $snapshots->{ $deleted->{child} } : undef;
    return if !$child;
    my ($target, $source) = $deleted->{parent} ? ($child, $deleted) : ($deleted, $child);
    my $virtual_size = max(map { $_->{'virtual-size'} // 0 } $deleted, $child);
    grow_as_asked(
        $class, $scfg, $storeid, $target->{file},
        {
            op => 'commit',
            target_lv => basename($target->{file}),
            source_lv => basename($source->{file}),
            virtual_size => int($virtual_size),
            running => $running ? JSON::true : JSON::false,
        },
    );
}

# The snapshot qemu-server is deleting from the running VM's $volid, when
# PVE::Storage::volume_snapshot_info was called by qemu-server's
# qemu_volume_snapshot_delete; undef otherwise. That call is the last thing
# before its block-commit or block-stream, which pass no 'on-error' and so fail
# on the first ENOSPC instead of pausing for the daemon: this is the one place
# to make room ahead of the job. qemu-server calls it without the storage lock.
# An offline delete goes through volume_snapshot_delete below instead.
#
# The call is found on the Perl call stack: frame 2 is PVE::Storage's
# volume_snapshot_info, and the first frame above it that is not an eval block
# must be qemu-server's sub, whose arguments name the drive and the snapshot.
# The qemu-server versions this was read against are pinned by
# tests/proxmox/test_qemu_server_calls.py; where qemu-server moves the call
# elsewhere, nothing matches here and pvestord's daemon, which grows a
# snapshot delete's job target as the job runs, warns that the job started
# unprepared.
my sub snapshot_deleted_online {
    my ($volid) = @_;

    # caller() fills @DB::args with a frame's arguments only when called from package DB.
    package DB;
    # Frames: 0 this sub, 1 volume_snapshot_info below, 2 PVE::Storage's, 3.. its callers.
    return undef if ((caller(2))[3] // '') ne 'PVE::Storage::volume_snapshot_info';
    for (my $level = 3; my @frame = caller($level); $level++) {
        # An eval block is a frame of its own, with no arguments; look past it.
        next if $frame[3] eq '(eval)';
        return undef if $frame[3] ne 'PVE::QemuServer::qemu_volume_snapshot_delete';
        # qemu_volume_snapshot_delete($vmid, $storecfg, $drive, $snap)
        my ($drive, $snap) = @DB::args[2, 3];
        return undef if ref($drive) ne 'HASH' || ($drive->{file} // '') ne $volid;
        return $snap;
    }
    return undef;
}

# LVMPlugin's chain of $volname, read by its LV name: LVMPlugin knows the top
# ('current') only by a name equal to the volume's, which a linked clone's
# ('<base>/<LV>') is not. A linked clone's oldest image is backed by its base,
# which is no snapshot: LVMPlugin records that parent as undef, and the undef
# as an entry of its own (with a Perl warning); both are dropped, so the chain
# ends at the clone's oldest image and QEMU opens the base from its header.
my sub chain_info {
    my ($class, $scfg, $storeid, $volname) = @_;

    my ($name, $basename, $isBase) = ($class->parse_volname($volname))[1, 3, 5];
    return $class->SUPER::volume_snapshot_info($scfg, $storeid, $volname)
        if !$isBase && !defined($basename);
    my $snapshots = do {
        local $SIG{__WARN__} = sub { warn @_ if $_[0] !~ m/uninitialized value \$parentname/ };
        $class->SUPER::volume_snapshot_info($scfg, $storeid, $name);
    };
    delete $snapshots->{''};
    for my $snap (values %$snapshots) {
        delete $snap->{parent} if !defined($snap->{parent});
    }
    return $snapshots;
}

sub volume_snapshot_info {
    my ($class, $scfg, $storeid, $volname) = @_;

    my $snapshots = chain_info($class, $scfg, $storeid, $volname);
    my $snap = snapshot_deleted_online("$storeid:$volname");
    make_room_for_delete($class, $scfg, $storeid, $snapshots, $snap, 1) if defined($snap);
    return $snapshots;
}

sub volume_snapshot_delete {
    my ($class, $scfg, $storeid, $volname, $snap, $running) = @_;

    assert_qcow2($class, $volname);
    # Offline, LVMPlugin writes one LV into another with qemu-img (commit into the
    # first snapshot, rebase of the child onto the parent). A running VM's delete
    # is qemu-server's block job, prepared in volume_snapshot_info above.
    # The LV merged into is tagged as a copy target with its growth: offline
    # it is reduced right after the delete, to what it then holds plus a chunk
    # (the chain would else ratchet up with every delete); a running VM's QEMU
    # has it open, so it is reduced at its next deactivation, the VM's stop.
    return $class->SUPER::volume_snapshot_delete($scfg, $storeid, $volname, $snap, $running)
        if $running;
    $class->activate_volume($storeid, $scfg, $volname);
    my $snapshots = $class->volume_snapshot_info($scfg, $storeid, $volname);
    {
        local $MERGING = 1;
        make_room_for_delete($class, $scfg, $storeid, $snapshots, $snap, 0);
        $class->SUPER::volume_snapshot_delete($scfg, $storeid, $volname, $snap, $running);
    }
    reduce_copy_target($class, $storeid, $scfg, $volname, undef, undef, 0);
    return;
}

# 'qm template': the disk becomes a base. pvestord names and retags it (the
# 'base' op: refused while the disk has snapshot LVs; its maximum becomes its
# LV size, as it never grows again); here it is renamed, retagged and made
# read-only in LVM, so that no node writes it again. Called under the storage
# lock (vdisk_create_base), for a stopped VM. A failure puts the LV back as it
# was. A base made of a linked clone keeps its parent tag: it still reads its
# own base.
sub create_base {
    my ($class, $storeid, $scfg, $volname) = @_;

    my ($name, $basename, $isBase, $format) = ($class->parse_volname($volname))[1, 3, 5, 6];
    die "create_base not possible with base image\n" if $isBase;
    die "storage type 'pvestord' makes templates of qcow2 disks only, not '$volname'\n"
        if $format ne 'qcow2';
    my $plan = ask($scfg, $storeid, { op => 'base', lv => $name });
    my ($vg, $newname) = ($scfg->{vgname}, $plan->{name});
    my @retag = (
        (map { ('--deltag', $_) } $plan->{deltags}->@*),
        (map { ('--addtag', $_) } $plan->{addtags}->@*),
    );
    PVE::Storage::LVMPlugin::lvrename($scfg, $name, $newname);
    my $retagged = 0;
    eval {
        run_command(['/sbin/lvchange', @retag, "$vg/$newname"],
            errmsg => "can't retag base '$vg/$newname'");
        $retagged = 1;
        run_command(['/sbin/lvchange', '--permission', 'r', "$vg/$newname"],
            errmsg => "can't make base '$vg/$newname' read-only");
    };
    if (my $err = $@) {
        eval {
            run_command([
                '/sbin/lvchange',
                (map { ('--deltag', $_) } $plan->{addtags}->@*),
                (map { ('--addtag', $_) } $plan->{deltags}->@*),
                "$vg/$newname",
            ]) if $retagged;
            PVE::Storage::LVMPlugin::lvrename($scfg, $newname, $name);
        };
        warn "'$vg/$name' was not put back as it was, it is '$vg/$newname': $@" if $@;
        die $err;
    }
    return defined($basename) ? "$basename/$newname" : $newname;
}

# 'qm clone' of a template, linked: a new qcow2 overlay LV whose backing file
# is the base's LV, by its device path. It is thin (pvestord's plan: the
# storage's initial size, tagged with its base), and the pvestord daemon grows
# it as its guest writes, as any disk. Under the storage lock (vdisk_clone).
sub clone_image {
    my ($class, $scfg, $storeid, $volname, $vmid, $snap) = @_;

    die "storage type 'pvestord' makes linked clones of templates only, not of snapshot"
        . " '$snap'\n"
        if $snap;
    my ($base, $isBase) = ($class->parse_volname($volname))[1, 5];
    die "clone_image only works on base images\n" if !$isBase;
    # The base (and any base below it) active here: its size is read, and the
    # new image is made on top of it.
    $class->activate_volume($storeid, $scfg, $volname);
    my $base_path = $class->path($scfg, $volname, $storeid);
    my $size = PVE::Storage::Plugin::file_size_info($base_path, 5, 'qcow2');
    die "file_size_info on '$base_path' failed\n" if !defined($size);
    my $name = $class->find_free_diskname($storeid, $scfg, $vmid, 'qcow2');
    my $plan = plan_volume(
        $class, $storeid, $scfg, $vmid, 'qcow2', $name, $size, 1, undef, $base,
    );
    $name = make_volume($class, $storeid, $scfg, $plan, $size, $base_path);
    return "$base/$name";
}

1;
