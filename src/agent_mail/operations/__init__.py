"""The operations over one mailbox, returning data: the Mailbox and its groups of operations."""
