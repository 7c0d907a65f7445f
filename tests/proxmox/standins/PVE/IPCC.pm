package PVE::IPCC;

# TEST STAND-IN for pve-cluster's XS module PVE::IPCC, which talks to pmxcfs.
# Answers the requests PVE::Cluster makes while PVE::Storage reads its config:
# files (CFS_IPC_GET_CONFIG) come from $ENV{PVESTORD_TEST_PVE_DIR}, the
# version, cluster and guest lists are those of a single node without guests.

use strict;
use warnings;

use Errno qw(ENOENT);
use JSON;

use PVE::Cluster::IPCConst;

sub ipcc_send_rec {
    my ($msgid, $data) = @_;

    $! = 0;
    if ($msgid == CFS_IPC_GET_CONFIG) {
        my ($path) = unpack('Z*', $data);
        my $dir = $ENV{PVESTORD_TEST_PVE_DIR} // die "PVESTORD_TEST_PVE_DIR is not set\n";
        open(my $fh, '<', "$dir/$path") or do { $! = ENOENT; return undef };
        local $/;
        my $text = <$fh>;
        close($fh);
        return $text;
    }
    return encode_json({ starttime => 1, clinfo => 1, vmlist => 1 })
        if $msgid == CFS_IPC_GET_FS_VERSION;
    return encode_json({ version => 1, nodelist => {} }) if $msgid == CFS_IPC_GET_CLUSTER_INFO;
    return encode_json({ version => 1, ids => {} }) if $msgid == CFS_IPC_GET_GUEST_LIST;
    return undef;
}

sub sendfd {
    die "PVE::IPCC stand-in: sendfd is not available in tests\n";
}

1;
