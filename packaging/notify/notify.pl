#!/usr/bin/perl
# pvestord's bridge to Proxmox's notification system: PVE::Notify is Perl
# only, so the daemon runs this with one notification as JSON on stdin:
#   {"severity": ..., "template": ..., "data": {...}, "fields": {...}}
# PVE::Notify renders the template and hands it to the matchers and targets
# the admin set up (Datacenter -> Notifications).
#
# Exit 3: no PVE::Notify here (not a Proxmox VE node): notifications are off,
# which the daemon logs once instead of every failure.
use strict;
use warnings;

# Checked first: on plain Debian (perl-base only) JSON::PP may be missing too,
# and "no PVE::Notify" is the answer the daemon understands.
if (!eval { require PVE::Notify; 1 }) {
    print STDERR "PVE::Notify is not available: $@";
    exit 3;
}
require JSON::PP;

my $text = do { local $/; <STDIN> };
my $notice = JSON::PP->new->decode($text);

# Proxmox's own callers start from common_template_data() (hostname, fqdn,
# cluster-name); ours add to it, so an admin's override template may use them.
my $data = PVE::Notify->can('common_template_data')
    ? PVE::Notify::common_template_data() : {};
$data = { %$data, %{ $notice->{data} } };

PVE::Notify::notify($notice->{severity}, $notice->{template}, $data, $notice->{fields});
exit 0;
