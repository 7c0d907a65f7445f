package PvestordTest::LvmRecorder;

# TEST STAND-IN: LVM and qemu-img as Proxmox's storage code runs them, recorded
# instead of run. Loaded after PvestordTest::StandIns (PVE::Storage is loaded),
# install() replaces run_command in the packages that imported it from
# PVE::Tools, for the commands upstream runs by absolute path (/sbin/lvcreate,
# /usr/bin/qemu-img, ...); every other command (pvestord itself) still runs.
#
# The VG lives in $ENV{PVESTORD_TEST_LVM_STATE}, a JSON file shared with the
# fake 'lvm' pvestord runs (PVESTORD_LVM, tests/proxmox/fake_lvm.py):
# {"vg", "size", "extent", "lvs": {name: {"size", "tags": [...],
# "virtual-size", "backing", "active", "permission"}}} ("virtual-size" and
# "backing" once qemu-img made an image on it; "active": false for an LV not
# active on this node, which both report inactive; "permission": "r" once
# made read-only). Each command is appended to $ENV{PVESTORD_TEST_LVM_LOG}, one JSON array
# a line; with $ENV{PVESTORD_TEST_LVM_LOCKS_LOG} also there, with the stand-in
# locks (PvestordTest::StandIns) held while it ran, by any process:
# {"command": [...], "locks": [lock ids]}.
#
# $ENV{PVESTORD_TEST_LVM_FAIL}: a JSON array; a command starting with those
# arguments fails as LVM would, changing nothing (a fault in the middle of a
# flow).
#
# The paths of the stand-in VG's LVs are not in /dev: stat() of one (as
# file_size_info does before it asks qemu-img) sees the state file, and the
# zeroing of LVMPlugin's saferemove, which looks for the LV's device-mapper
# device in /dev and /sys, is handed a made-up one (which accepts
# write-zeroes), so that it runs its 'blkdiscard --zeroout' here too,
# recorded like the rest.

use strict;
use warnings;

use Fcntl qw(:flock);
use File::stat qw();
use JSON;

use PVE::Tools;

my $real_run_command = \&PVE::Tools::run_command;

my sub load_state {
    open(my $fh, '<', $ENV{PVESTORD_TEST_LVM_STATE}) or die "LVM state: $!\n";
    local $/;
    return decode_json(<$fh>);
}

my sub save_state {
    my ($state) = @_;
    open(my $fh, '>', $ENV{PVESTORD_TEST_LVM_STATE}) or die "LVM state: $!\n";
    print {$fh} encode_json($state);
    close($fh);
}

# The stand-in locks someone holds now: those whose file a new open file
# description cannot flock (a flock conflicts across descriptions, even in
# one process).
my sub locks_held {
    my $dir = $ENV{PVESTORD_TEST_LOCK_DIR} // return [];
    opendir(my $dh, $dir) or die "lock dir: $!\n";
    my @held;
    for my $lockid (sort grep { !/^\./ } readdir($dh)) {
        open(my $fh, '<', "$dir/$lockid") or next;
        if (flock($fh, LOCK_EX | LOCK_NB)) {
            flock($fh, LOCK_UN);
        } else {
            push @held, $lockid;
        }
        close($fh);
    }
    closedir($dh);
    return \@held;
}

my sub record {
    my ($cmd) = @_;
    my $command = [map {"$_"} @$cmd];
    open(my $fh, '>>', $ENV{PVESTORD_TEST_LVM_LOG}) or die "LVM log: $!\n";
    print {$fh} encode_json($command), "\n";
    close($fh);
    my $locks_log = $ENV{PVESTORD_TEST_LVM_LOCKS_LOG} // return;
    open($fh, '>>', $locks_log) or die "LVM locks log: $!\n";
    print {$fh} encode_json({ command => $command, locks => locks_held() }), "\n";
    close($fh);
}

# Whether $cmd is the one $ENV{PVESTORD_TEST_LVM_FAIL} makes fail.
my sub failing {
    my ($cmd) = @_;
    my $prefix = decode_json($ENV{PVESTORD_TEST_LVM_FAIL} // return 0);
    return 0 if @$prefix > @$cmd;
    for my $i (0 .. $#$prefix) {
        return 0 if $cmd->[$i] ne $prefix->[$i];
    }
    return 1;
}

# LVM's sizes: bytes with 'b', KiB with 'k' or no unit (lvcreate's default as
# LVMPlugin::lvcreate writes it); LVM rounds up to whole extents.
my sub lv_bytes {
    my ($text, $extent) = @_;
    my ($number, $unit) = $text =~ m/^([0-9.]+)([bkmgBKMG]?)$/ or die "bad size '$text'\n";
    my $bytes = $number * { b => 1, '' => 1024, k => 1024, m => 1024**2, g => 1024**3 }->{ lc $unit };
    return int(($bytes + $extent - 1) / $extent) * $extent;
}

my sub option_values {
    my ($cmd, $option) = @_;
    my @values;
    for my $i (0 .. $#$cmd - 1) {
        push @values, $cmd->[$i + 1] if $cmd->[$i] eq $option;
    }
    return @values;
}

my sub simulate {
    my ($cmd, %param) = @_;

    my $out = $param{outfunc} // sub { };
    die(($param{errmsg} // "@$cmd") . ": stand-in fault (PVESTORD_TEST_LVM_FAIL)\n")
        if failing($cmd);
    my $state = load_state();
    my ($vg, $lvs) = ($state->{vg}, $state->{lvs});
    my $tool = $cmd->[0] =~ s{.*/}{}r;
    if ($tool eq 'vgs') {
        my $used = 0;
        $used += $_->{size} for values %$lvs;
        $out->("  $vg:$state->{size}:" . ($state->{size} - $used) . ':' . scalar(keys %$lvs));
    } elsif ($tool eq 'lvs') {
        for my $name (sort keys %$lvs) {
            my $lv = $lvs->{$name};
            my $tags = join(',', $lv->{tags}->@*);
            my $attr = '-' . (($lv->{permission} // 'rw') eq 'r' ? 'r' : 'w') . 'i-'
                . (($lv->{active} // 1) ? 'a' : '-') . '-----';
            $out->("  $vg:$name:$lv->{size}:${attr}:::::uuid-$name:${tags}::1700000000");
        }
    } elsif ($tool eq 'lvcreate') {
        my ($name) = option_values($cmd, '--name');
        my ($size) = option_values($cmd, '--size');
        die "lvcreate: '$name' exists\n" if $lvs->{$name};
        my $bytes = lv_bytes($size, $state->{extent});
        my $free = $state->{size};
        $free -= $_->{size} for values %$lvs;
        die "$param{errmsg}: Volume group \"$vg\" has insufficient free space\n"
            if $bytes > $free;
        $lvs->{$name} = { size => $bytes, tags => [option_values($cmd, '--addtag')] };
    } elsif ($tool eq 'lvextend') {
        # LVMPlugin writes '-L <KiB>k', the plugin '--size <bytes>b'; LVM refuses
        # a size that does not grow the LV.
        my ($size) = (option_values($cmd, '-L'), option_values($cmd, '--size'));
        my ($name) = $cmd->[-1] =~ m{^(?:/dev/)?\Q$vg\E/(.+)$} or die "lvextend: '$cmd->[-1]'?\n";
        my $lv = $lvs->{$name} or die "lvextend: no LV '$cmd->[-1]'\n";
        my $bytes = lv_bytes($size, $state->{extent});
        die "lvextend: new size not larger than $lv->{size}\n" if $bytes <= $lv->{size};
        $lv->{size} = $bytes;
    } elsif ($tool eq 'lvremove') {
        my $target = $cmd->[-1];
        my ($name) = $target =~ m{^(?:/dev/)?\Q$vg\E/(.+)$} or die "lvremove: '$target'?\n";
        delete $lvs->{$name} or die "lvremove: no LV '$target'\n";
    } elsif ($tool eq 'lvrename') {
        my ($old, $new) = $cmd->@[2, 3];
        $lvs->{$new} = delete $lvs->{$old} or die "lvrename: no LV '$old'\n";
    } elsif ($tool eq 'qemu-img' && $cmd->[1] eq 'create') {
        my ($backing) = option_values($cmd, '-b');
        # The image made: the LV path that is not the backing file's.
        my ($path) = grep { m{^/dev/\Q$vg\E/} && $_ ne ($backing // '') } @$cmd;
        my ($name) = $path =~ m{^/dev/\Q$vg\E/(.+)$};
        die "qemu-img create: no LV '$path'\n" if !$lvs->{$name};
        # A linked clone names its base by its device path.
        $backing =~ s{^/dev/\Q$vg\E/}{} if defined($backing);
        if (defined($backing)) {
            # An overlay: the backing file's name, relative to the overlay's folder.
            my $base = $lvs->{$backing} or die "qemu-img create: no backing '$backing'\n";
            $lvs->{$name}->{backing} = $backing;
            $lvs->{$name}->{'virtual-size'} = $base->{'virtual-size'};
        } else {
            $lvs->{$name}->{'virtual-size'} = lv_bytes($cmd->[-1] =~ s/K$/k/r, 1);
        }
    } elsif ($tool eq 'qemu-img' && $cmd->[1] eq 'info') {
        my ($path) = grep { m{^/dev/} } @$cmd;
        my ($name) = $path =~ m{^/dev/\Q$vg\E/(.+)$};
        die "qemu-img info: no LV '$path'\n" if !$lvs->{$name};
        my @chain;
        while (defined($name)) {
            my $lv = $lvs->{$name};
            # actual-size: what qemu-img says of a block device (its allocation is unknown).
            my $image = { filename => "/dev/$vg/$name", format => 'qcow2',
                'virtual-size' => $lv->{'virtual-size'} // 0, 'actual-size' => 0 };
            $image->{'backing-filename'} = $lv->{backing} if $lv->{backing};
            push @chain, $image;
            $name = $lv->{backing};
        }
        # Proxmox asks for the backing chain (an array) or one image (an object).
        $out->(encode_json((grep { $_ eq '--backing-chain' } @$cmd) ? \@chain : $chain[0]));
    } elsif ($tool eq 'blkdiscard') {
        my ($path) = grep { m{^/dev/} } @$cmd;
        my ($name) = $path =~ m{^/dev/\Q$vg\E/(.+)$};
        die "blkdiscard: no LV '$path'\n" if !$name || !$lvs->{$name};
    } elsif ($tool eq 'lvchange') {
        # Activation by a selection changes nothing here; named LVs are
        # (de)activated ("active") and made read-only or writable
        # ("permission"). Tags are VG metadata, kept. LVM deletes before it
        # adds, and keeps a tag once.
        my @named = map { m{^(?:/dev/)?\Q$vg\E/(.+)$} ? ($1) : () } $cmd->@[1 .. $#$cmd];
        for my $name (@named) {
            my $lv = $lvs->{$name} or die "lvchange: no LV '$vg/$name'\n";
            $lv->{active} = JSON::true if grep { m/^-a[els]?y$/ } @$cmd;
            $lv->{active} = JSON::false if grep { m/^-al?n$/ } @$cmd;
            my ($permission) = option_values($cmd, '--permission');
            $lv->{permission} = $permission if defined($permission);
        }
        my @del = option_values($cmd, '--deltag');
        my @add = option_values($cmd, '--addtag');
        if (@del || @add) {
            my ($name) = $cmd->[-1] =~ m{^(?:/dev/)?\Q$vg\E/(.+)$}
                or die "lvchange: '$cmd->[-1]'?\n";
            my $lv = $lvs->{$name} or die "lvchange: no LV '$cmd->[-1]'\n";
            my %gone = map { $_ => 1 } @del;
            my @tags = grep { !$gone{$_} } $lv->{tags}->@*;
            for my $tag (@add) {
                push @tags, $tag if !grep { $_ eq $tag } @tags;
            }
            $lv->{tags} = \@tags;
        }
    } else {
        die "the LVM stand-in does not know '@$cmd'\n";
    }
    save_state($state);
    return 0;
}

sub install {
    no warnings 'redefine';
    my $recording = sub {
        my ($cmd, %param) = @_;
        if (ref($cmd) eq 'ARRAY' && $cmd->[0] =~ m{^(?:/sbin/|/usr/sbin/|/usr/bin/qemu-img$|blkdiscard$)}) {
            record($cmd);
            return simulate($cmd, %param);
        }
        return $real_run_command->($cmd, %param);
    };
    for my $package (qw(PVE::Storage PVE::Storage::Plugin PVE::Storage::LVMPlugin
        PVE::Storage::Common PVE::Storage::Custom::PvestordPlugin)) {
        no strict 'refs';
        *{"${package}::run_command"} = $recording;
    }
    my $real_stat = \&File::stat::stat;
    *File::stat::stat = sub ($) {
        my ($path) = @_;
        if (!ref($path)) {
            my $state = load_state();
            return $real_stat->($ENV{PVESTORD_TEST_LVM_STATE})
                if $path =~ m{^/dev/\Q$state->{vg}\E/(.+)$} && $state->{lvs}->{$1};
        }
        return $real_stat->(@_);
    };
    # saferemove's look for the device: a made-up dm device for each LV of the VG.
    my $real_abs_path = \&PVE::Storage::LVMPlugin::abs_path;
    *PVE::Storage::LVMPlugin::abs_path = sub {
        my ($path) = @_;
        my $state = load_state();
        if ($path =~ m{^/dev/\Q$state->{vg}\E/(.+)$} && $state->{lvs}->{$1}) {
            my @names = sort keys $state->{lvs}->%*;
            my ($index) = grep { $names[$_] eq $1 } 0 .. $#names;
            return "/dev/dm-$index";
        }
        return $real_abs_path->($path);
    };
    my $real_firstline = \&PVE::Storage::LVMPlugin::file_read_firstline;
    *PVE::Storage::LVMPlugin::file_read_firstline = sub {
        my ($path) = @_;
        return 33554432 if $path =~ m{^/sys/block/dm-\d+/queue/write_zeroes_max_bytes$};
        return $real_firstline->($path);
    };
}

1;
