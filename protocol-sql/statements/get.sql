-- params: id text
select * from cairnq_tasks where id = :id
