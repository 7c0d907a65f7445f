package PvestordTest::Session;

# TEST DRIVER: one Perl process that loaded PVE::Storage once (loading it takes
# long under the node guest's emulation) runs many requests. Each stdin line is
# a JSON string of Perl code, evaluated with $cfg = PVE::Storage::config() read
# afresh; each answer is one JSON line {"result": ..., "error": ...} on the
# original stdout. Everything else the code prints (run_command echoes command
# output) goes to stderr.

use strict;
use warnings;

use JSON;

use PvestordTest::StandIns;

sub serve {
    open(my $answers, '>&', \*STDOUT) or die "dup stdout: $!\n";
    open(STDOUT, '>&', \*STDERR) or die "stdout to stderr: $!\n";
    $answers->autoflush(1);
    # Whatever a storage call returns, an answer goes out (unencodable values as null).
    my $json = JSON->new->allow_nonref->allow_blessed->allow_unknown->canonical;
    while (defined(my $line = <STDIN>)) {
        my $code = $json->decode($line);
        my $result = eval {
            my $cfg = PVE::Storage::config();
            my $sub = eval "sub { my (\$cfg) = \@_; $code }" or die $@;
            return $sub->($cfg);
        };
        my $error = $@;
        print {$answers} $json->encode({ result => $error ? undef : $result, error => "$error" }),
            "\n";
    }
}

1;
