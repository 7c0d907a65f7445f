package PvestordTest::StandIns;

# TEST STAND-IN set-up: load Proxmox's real PVE::Storage with pvestord's plugin
# registered, as upstream's loader would register it from
# /usr/share/perl5/PVE/Storage/Custom, and with the pmxcfs locks replaced.
#
# cfs_lock_storage / cfs_lock_file mkdir below /etc/pve/priv/lock, which only
# pmxcfs serves. The stand-in keeps their contract with a flock on a file in
# $ENV{PVESTORD_TEST_LOCK_DIR}: the wait for the lock is bounded by $timeout
# (10 s by default); the code then runs under an alarm, 60 s as in
# PVE::Cluster::cfs_lock (pmxcfs expires a lock after 120 s, the alarm aborts
# the holder first), whose expiry dies with cfs_lock's message; the code's
# result is returned, an error is left in $@ and undef returned; the caller's
# own alarm is re-armed afterwards. A test shortens the alarm with
# $PvestordTest::StandIns::LOCKED_COMMAND_ALARM. Locks nest as cfs_lock's do
# (each suspends the alarm around it and re-arms it afterwards).
#
# $ENV{PVESTORD_TEST_COMMAND}: the pvestord the plugin runs (the checkout's),
# instead of the installed /usr/bin/pvestord.

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

# Seconds the locked code may run, as cfs_lock's alarm(60).
our $LOCKED_COMMAND_ALARM = 60;

# $ENV{PVESTORD_TEST_LOCK_ORDER_LOG}: each lock id appended as it is taken,
# one a line (the order a holder takes several in).
my sub record_taken {
    my ($lockid) = @_;
    my $log = $ENV{PVESTORD_TEST_LOCK_ORDER_LOG} // return;
    open(my $fh, '>>', $log) or die "lock order log: $!\n";
    print {$fh} "$lockid\n";
    close($fh);
}

my sub local_lock {
    my ($lockid, $timeout, $code, @param) = @_;

    my $dir = $ENV{PVESTORD_TEST_LOCK_DIR} // die "PVESTORD_TEST_LOCK_DIR is not set\n";
    my $prev_alarm = alarm(0);
    my ($res, $is_code_err);
    my $fh;
    eval {
        open($fh, '>>', "$dir/$lockid") or die "cannot open lock $lockid: $!\n";
        local $SIG{ALRM} = sub { die "got lock request timeout\n" };
        alarm($timeout || 10);
        flock($fh, LOCK_EX) or die "flock $lockid: $!\n";
        record_taken($lockid);
        local $SIG{ALRM} = sub { die "'$lockid'-locked command timed out - aborting\n" };
        alarm($LOCKED_COMMAND_ALARM);
        $is_code_err = 1;
        $res = $code->(@param);
        alarm(0);
    };
    my $err = $@;
    alarm(0);
    close($fh) if $fh;
    alarm($prev_alarm);
    if ($err) {
        $@ = ref($err) eq 'PVE::Exception' || $is_code_err ? $err : "cfs-lock '$lockid' error: $err";
        return undef;
    }
    $@ = undef;
    return $res;
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

# The plugin's own path to pvestord is the installed one; point it at the checkout's.
$PVE::Storage::Custom::PvestordPlugin::PVESTORD = $ENV{PVESTORD_TEST_COMMAND}
    if defined($ENV{PVESTORD_TEST_COMMAND});

PVE::RPCEnvironment->init('cli');

1;
