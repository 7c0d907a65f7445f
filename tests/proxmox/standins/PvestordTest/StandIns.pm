package PvestordTest::StandIns;

# TEST STAND-IN set-up: load Proxmox's real PVE::Storage with pvestord's plugin
# registered, as upstream's loader would register it from
# /usr/share/perl5/PVE/Storage/Custom, and with the pmxcfs locks replaced.
#
# cfs_lock_storage / cfs_lock_file mkdir below /etc/pve/priv/lock, which only
# pmxcfs serves. The stand-in keeps their contract (the code's result is
# returned, an error is left in $@ and undef returned) with a flock on a file
# in $ENV{PVESTORD_TEST_LOCK_DIR}.

use strict;
use warnings;

use Fcntl qw(:flock);

use PVE::Cluster;
use PVE::Storage::Plugin;
use PVE::Storage::LVMPlugin;

# PVESTORD_TEST_NO_REGISTER: leave it to upstream's loader (an installed plugin).
BEGIN {
    if (!$ENV{PVESTORD_TEST_NO_REGISTER}) {
        require PVE::Storage::Custom::PvestordPlugin;
        PVE::Storage::Custom::PvestordPlugin->register();
    }
}

use PVE::Storage;
use PVE::RPCEnvironment;

my sub local_lock {
    my ($lockid, $timeout, $code, @param) = @_;

    my $dir = $ENV{PVESTORD_TEST_LOCK_DIR} // die "PVESTORD_TEST_LOCK_DIR is not set\n";
    open(my $fh, '>>', "$dir/$lockid") or do { $@ = "cannot open lock $lockid: $!\n"; return };
    my $res = eval {
        local $SIG{ALRM} = sub { die "got lock request timeout\n" };
        alarm($timeout || 10);
        flock($fh, LOCK_EX) or die "flock $lockid: $!\n";
        alarm(0);
        return $code->(@param);
    };
    my $err = $@;
    alarm(0);
    close($fh);
    $@ = $err;
    return $err ? undef : $res;
}

{
    no warnings 'redefine';
    *PVE::Cluster::cfs_lock_storage = sub {
        my ($storeid, @rest) = @_;
        return local_lock("storage-$storeid", @rest);
    };
    my $lock_file = sub {
        my ($filename, @rest) = @_;
        (my $lockid = "file-$filename") =~ s/[.\/]/_/g;
        return local_lock($lockid, @rest);
    };
    # PVE::Storage imported its own copy of cfs_lock_file.
    *PVE::Cluster::cfs_lock_file = $lock_file;
    *PVE::Storage::cfs_lock_file = $lock_file;
}

PVE::RPCEnvironment->init('cli');

1;
