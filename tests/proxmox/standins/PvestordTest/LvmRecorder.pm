package PvestordTest::LvmRecorder;

# TEST STAND-IN: LVM and qemu-img as Proxmox's storage code runs them, recorded
# instead of run. Loaded after PvestordTest::StandIns (PVE::Storage is loaded),
# install() replaces run_command in the packages that imported it from
# PVE::Tools, for the commands upstream runs by absolute path (/sbin/lvcreate,
# /usr/bin/qemu-img, ...); every other command (pvestord itself) still runs.
#
# The VG lives in $ENV{PVESTORD_TEST_LVM_STATE}, a JSON file shared with the
# fake 'lvm' pvestord runs (PVESTORD_LVM, tests/proxmox/fake_lvm.py):
# {"vg", "size", "extent", "lvs": {name: {"size", "tags": [...]}}}. Each
# command is appended to $ENV{PVESTORD_TEST_LVM_LOG}, one JSON array a line.

use strict;
use warnings;

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

my sub record {
    my ($cmd) = @_;
    open(my $fh, '>>', $ENV{PVESTORD_TEST_LVM_LOG}) or die "LVM log: $!\n";
    print {$fh} encode_json([map {"$_"} @$cmd]), "\n";
    close($fh);
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
            $out->("  $vg:$name:$lv->{size}:-wi-a-----:::::uuid-$name:$tags::1700000000");
        }
    } elsif ($tool eq 'lvcreate') {
        my ($name) = option_values($cmd, '--name');
        my ($size) = option_values($cmd, '--size');
        die "lvcreate: '$name' exists\n" if $lvs->{$name};
        $lvs->{$name} = {
            size => lv_bytes($size, $state->{extent}),
            tags => [option_values($cmd, '--addtag')],
        };
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
        my ($path, $size) = $cmd->@[-2, -1];
        my ($name) = $path =~ m{^/dev/\Q$vg\E/(.+)$};
        $lvs->{$name}->{'virtual-size'} = lv_bytes($size =~ s/K$/k/r, 1) if $name;
    } elsif ($tool eq 'qemu-img' && $cmd->[1] eq 'info') {
        my ($path) = grep { m{^/dev/} } @$cmd;
        my ($name) = $path =~ m{^/dev/\Q$vg\E/(.+)$};
        my $image = { filename => $path, format => 'qcow2',
            'virtual-size' => $lvs->{$name}->{'virtual-size'} // 0 };
        # Proxmox asks for the backing chain (an array) or one image (an object).
        $out->(encode_json((grep { $_ eq '--backing-chain' } @$cmd) ? [$image] : $image));
    } elsif ($tool ne 'lvchange') {
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
}

1;
